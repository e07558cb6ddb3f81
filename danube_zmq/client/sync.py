"""A blocking facade over the asyncio client, for scripts and threads.

`SyncClient` runs a `DanubeClient` on its own event loop in a background thread; every
method hands a coroutine to that loop and blocks for the result. Method names and
arguments are those of the asyncio classes.

    with SyncClient("tcp://127.0.0.1:6650") as client:
        producer = client.create_producer("/default/orders")
        producer.send(b"hello")
        consumer = client.subscribe("/default/orders", "audit")
        msg = consumer.receive(timeout=5)
        consumer.ack(msg)

Send callbacks (`send_nowait(..., callback=)`) run on the client's loop thread; they
must not call blocking methods of this facade (that would deadlock, and raises).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Iterator, Mapping
from typing import Any, TypeVar

from danube_zmq.client.client import DanubeClient
from danube_zmq.client.consumer import Consumer
from danube_zmq.client.errors import AlreadyClosed
from danube_zmq.client.message import Message, MessageId
from danube_zmq.client.producer import Producer, SendCallback
from danube_zmq.client.reader import Reader
from danube_zmq.transport.errors import FailedPrecondition

T = TypeVar("T")


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise FailedPrecondition("blocking danube-zmq calls cannot run on the client's own loop thread")
        if self.loop.is_closed():
            coro.close()
            raise AlreadyClosed("client is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise AlreadyClosed("client closed while the call was running") from None
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt while blocked: stop the coroutine too
            raise

    def stop(self) -> None:
        """Cancel what still runs on the loop (its callers get `AlreadyClosed`), then stop."""
        if self.loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(_cancel_others(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


async def _cancel_others() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class SyncClient:
    """Blocking twin of `DanubeClient`; takes the same arguments."""

    def __init__(self, service_url: str, **options: Any) -> None:
        self._runner = _LoopThread("danube-zmq-client")
        try:
            self._client = self._runner.call(self._open(service_url, options))
        except BaseException:
            self._runner.stop()
            raise

    @staticmethod
    async def _open(service_url: str, options: dict[str, Any]) -> DanubeClient:
        client = DanubeClient(service_url, **options)
        try:
            await client.start()
        except BaseException:
            await client.close()
            raise
        return client

    @property
    def client(self) -> DanubeClient:
        """The asyncio client underneath (use only from its loop)."""
        return self._client

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` (work of your own with `client` and what it made) on the
        client's loop and block for its result."""
        return self._runner.call(coro)

    def create_producer(self, topic: str, **options: Any) -> SyncProducer:
        return SyncProducer(self._runner, self._runner.call(self._client.create_producer(topic, **options)))

    def subscribe(self, topic: str, subscription: str, **options: Any) -> SyncConsumer:
        return SyncConsumer(self._runner, self._runner.call(self._client.subscribe(topic, subscription, **options)))

    def create_reader(self, topic: str, **options: Any) -> SyncReader:
        return SyncReader(self._runner, self._runner.call(self._client.create_reader(topic, **options)))

    def get_partitions(self, topic: str) -> list[str]:
        return self._runner.call(self._client.get_partitions(topic))

    def get_topics(self, namespace: str) -> list[str]:
        """The topics of `namespace`, sorted, a partitioned one by its base name
        (`DanubeClient.get_topics`)."""
        return self._runner.call(self._client.get_topics(namespace))

    def close(self) -> None:
        if self._runner.loop.is_closed():
            return
        try:
            self._runner.call(self._client.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SyncProducer:
    def __init__(self, runner: _LoopThread, producer: Producer) -> None:
        self._runner = runner
        self.producer = producer

    @property
    def topic(self) -> str:
        return self.producer.topic

    @property
    def name(self) -> str:
        return self.producer.name

    @property
    def last_sequence_id(self) -> int:
        return self.producer.last_sequence_id

    def send(
        self, payload: Any, *, key: str | None = None, attributes: Mapping[str, str] | None = None,
        publish_time: int | None = None, sequence_id: int | None = None, deliver_after_ms: int | None = None,
        deliver_at_ms: int | None = None,
    ) -> MessageId:
        return self._runner.call(self.producer.send(payload, key=key, attributes=attributes,
                                                    publish_time=publish_time, sequence_id=sequence_id,
                                                    deliver_after_ms=deliver_after_ms, deliver_at_ms=deliver_at_ms))

    def send_nowait(
        self,
        payload: Any,
        *,
        key: str | None = None,
        attributes: Mapping[str, str] | None = None,
        callback: SendCallback | None = None,
        publish_time: int | None = None,
        sequence_id: int | None = None,
        deliver_after_ms: int | None = None,
        deliver_at_ms: int | None = None,
    ) -> concurrent.futures.Future[MessageId]:
        """Queue a message; returns a `concurrent.futures.Future` of its id. Raises
        `ProducerQueueFull` at once when the producer is full."""
        result: concurrent.futures.Future[MessageId] = concurrent.futures.Future()

        async def enqueue() -> None:
            future = self.producer.send_nowait(payload, key=key, attributes=attributes, callback=callback,
                                               publish_time=publish_time, sequence_id=sequence_id,
                                               deliver_after_ms=deliver_after_ms, deliver_at_ms=deliver_at_ms)

            def copy(done: asyncio.Future[MessageId]) -> None:
                if done.cancelled():
                    result.cancel()
                elif done.exception() is not None:
                    result.set_exception(done.exception())  # type: ignore[arg-type]
                else:
                    result.set_result(done.result())

            future.add_done_callback(copy)

        self._runner.call(enqueue())
        return result

    def flush(self) -> None:
        self._runner.call(self.producer.flush())

    def close(self) -> None:
        self._runner.call(self.producer.close())

    def statistics(self) -> Any:
        return self.producer.statistics()

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SyncConsumer:
    def __init__(self, runner: _LoopThread, consumer: Consumer) -> None:
        self._runner = runner
        self.consumer = consumer

    @property
    def topic(self) -> str:
        return self.consumer.topic

    def receive(self, timeout: float | None = None) -> Message:
        return self._runner.call(self.consumer.receive(timeout))

    def batch_receive(self, max_messages: int | None = None, timeout: float | None = None) -> list[Message]:
        return self._runner.call(self.consumer.batch_receive(max_messages, timeout))

    def __iter__(self) -> Iterator[Message]:
        """Messages until the consumer is closed."""
        while True:
            try:
                yield self.receive()
            except AlreadyClosed:
                return

    def ack(self, message: Message | MessageId | list[Message]) -> None:
        self._runner.call(self.consumer.ack(message))

    def nack(self, message: Message | MessageId, delay_ms: int | None = None) -> None:
        self._runner.call(self.consumer.nack(message, delay_ms))

    def seek(self, *, offset: int | None = None, publish_time: int | None = None) -> None:
        """Move the subscription (reliable topics); see `Consumer.seek`."""
        self._runner.call(self.consumer.seek(offset=offset, publish_time=publish_time))

    def unsubscribe(self) -> None:
        self._runner.call(self.consumer.unsubscribe())

    def close(self) -> None:
        self._runner.call(self.consumer.close())

    def statistics(self) -> Any:
        return self.consumer.statistics()

    def __enter__(self) -> SyncConsumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SyncReader:
    """Blocking twin of `Reader`."""

    def __init__(self, runner: _LoopThread, reader: Reader) -> None:
        self._runner = runner
        self.reader = reader

    @property
    def topic(self) -> str:
        return self.reader.topic

    def read_next(self, timeout: float | None = None) -> Message:
        return self._runner.call(self.reader.read_next(timeout))

    def has_message_available(self) -> bool:
        return self._runner.call(self.reader.has_message_available())

    def seek(self, *, offset: int | None = None, publish_time: int | None = None) -> None:
        self._runner.call(self.reader.seek(offset=offset, publish_time=publish_time))

    def __iter__(self) -> Iterator[Message]:
        """Messages until the reader is closed."""
        while True:
            try:
                yield self.read_next()
            except AlreadyClosed:
                return

    def close(self) -> None:
        self._runner.call(self.reader.close())

    def __enter__(self) -> SyncReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

"""`DanubeClient`, the asyncio entry point: connections, topics, producers, consumers.

    async with DanubeClient("tcp://127.0.0.1:6650") as client:
        producer = await client.create_producer("/default/orders")
        await producer.send(b"hello")
        consumer = await client.subscribe("/default/orders", "audit")
        async for msg in consumer:
            await consumer.ack(msg)

With a registered schema, `create_producer(topic, schema_subject="orders")` encodes what
`send` is given and `msg.value()` decodes it (`client.schemas` caches the versions).

The client keeps one `Connection` per broker URL (the service URL, plus any broker a
redirect names) and retries operations that fail with a `retriable` error up to
`operation_retries_max` times with exponential backoff (100 ms to 1 s).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import os
import random
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import zmq
import zmq.asyncio

from danube_zmq.client.connection import WRITE_LINGER_US_DEFAULT, Connection, ConnectionStatistics
from danube_zmq.client.consumer import Consumer
from danube_zmq.client.errors import AlreadyClosed
from danube_zmq.client.producer import BatchCallback, Producer
from danube_zmq.client.reader import Reader, check_reliable
from danube_zmq.client.retry import backoff_ms
from danube_zmq.client.schema_cache import SchemaCache, reader_definition
from danube_zmq.clock import Clock, SystemClock
from danube_zmq.rpc.tokens import TokenProvider, TokenSource, token_source
from danube_zmq.security.curve import ClientCurve, ClientKeys, ServerKey, client_curve
from danube_zmq.transport.client_protocol import (
    DispatchStrategy,
    GetPartitions,
    GetTopicsOfNamespace,
    InitialPosition,
    Lookup,
    LookupResult,
    Partitions,
    SubType,
    TopicsOfNamespace,
)
from danube_zmq.transport.codec import Message as TransportMessage
from danube_zmq.transport.compression import check_codec
from danube_zmq.transport.errors import (
    DanubeError,
    InternalError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)

log = logging.getLogger("danube_zmq.client")

RELIABLE_INFLIGHT_BATCHES = 4
"""Batches a reliable producer keeps awaiting receipts by default (see `create_producer`)."""

T = TypeVar("T")
E = TypeVar("E", bound=enum.Enum)


def parse_enum(value: Any, enum_cls: type[E], what: str) -> E:
    """Accept the enum, its int value, or its name in any case with `_`, `-` or nothing
    between words ("key_shared", "Key-Shared", "keyshared")."""
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, str):
        wanted = value.strip().upper().replace("-", "").replace("_", "")
        for member in enum_cls:
            if member.name.replace("_", "") == wanted:
                return member
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            return enum_cls(value)
        except ValueError:
            pass
    names = ", ".join(repr(m.name.lower()) for m in enum_cls)
    raise InvalidArgument(f"{what} must be one of {names}, got {value!r}")


def _check_schema_choice(subject: Any, version: Any, min_version: Any) -> None:
    if subject is None:
        if version is not None or min_version is not None:
            raise InvalidArgument("schema_version and schema_min_version need a schema_subject")
        return
    if not isinstance(subject, str) or not subject:
        raise InvalidArgument(f"schema_subject must be a non-empty str, got {subject!r}")
    if version is not None and min_version is not None:
        raise InvalidArgument("pin a schema_version or ask for a schema_min_version, not both")
    for what, value in (("schema_version", version), ("schema_min_version", min_version)):
        if value is not None and (type(value) is not int or value < 1):
            raise InvalidArgument(f"{what} must be an int >= 1, got {value!r}")


def _check_positive(**values: Any) -> None:
    for name, value in values.items():
        if type(value) is not int or value <= 0:
            raise InvalidArgument(f"{name} must be a positive int, got {value!r}")


def _check_name(what: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} must be a non-empty str, got {value!r}")


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    service_url: str
    producers: int
    consumers: int
    connections: tuple[ConnectionStatistics, ...]


class DanubeClient:
    """An asyncio client of a danube-zmq broker (or cluster, through redirects).

    `request_timeout_ms` bounds every request round trip; `operation_retries_max`
    bounds retries of retriable failures (of one request or batch: an open producer or
    consumer keeps re-attaching, with capped backoff, for as long as failures are
    retriable); `pending_requests_max` bounds requests in flight per connection;
    `reconnect_attempts_max` bounds re-handshakes after a connection is lost (then
    everything on it fails with `Unavailable`).
    `write_linger_us` (default 1,000) is how long a connection's write round waits for
    more requests while one of an earlier round still awaits its reply (0: every round
    leaves at the end of the event loop's turn); a lone request never waits.
    `server_public_key` (the cluster's public key: Z85 text or a `.key` file) makes every
    connection CURVE; `client_keys` (a `.key_secret` file or a (public, secret) Z85 pair)
    are this client's, a fresh pair when left out; both default to the environment
    (DANUBE_SERVER_KEY, DANUBE_CLIENT_KEYS). A broker that refuses the handshake fails
    the connect at once with the cause (docs/security.md).
    `token` (a JWT) goes in every connection's `Connect`; or `token_provider`, a callable
    (sync or async) returning one, asked at every `Connect` and again when the broker
    answers UNAUTHENTICATED (the token expired or was revoked): the session is opened
    again with the new token, producers and consumers re-attach, and the refused request
    is retried. With a fixed token UNAUTHENTICATED is raised, with the broker's reason.
    Neither given: DANUBE_TOKEN, if set. A token is never logged nor shown by `repr`.
    `use_env=False` reads none of DANUBE_SERVER_KEY, DANUBE_CLIENT_KEYS, DANUBE_TOKEN.
    `clock` and `rng` (the jitter of retry backoff) are injectable for tests; routing ids
    and generated names come from `secrets`, never from `rng`.
    """

    def __init__(
        self,
        service_url: str,
        *,
        client_name: str | None = None,
        request_timeout_ms: int = 10_000,
        operation_retries_max: int = 5,
        pending_requests_max: int = 1_000,
        reconnect_attempts_max: int = 120,
        connections_max: int = 16,
        socket_hwm_messages: int = 10_000,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        write_linger_us: int = WRITE_LINGER_US_DEFAULT,
        server_public_key: ServerKey | None = None,
        client_keys: ClientKeys | None = None,
        token: str | None = None,
        token_provider: TokenProvider | None = None,
        use_env: bool = True,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        _check_name("service_url", service_url)
        if type(write_linger_us) is not int or not 0 <= write_linger_us <= 1_000_000:
            raise InvalidArgument(f"write_linger_us must be an int in 0..1000000, got {write_linger_us!r}")
        _check_positive(
            request_timeout_ms=request_timeout_ms,
            pending_requests_max=pending_requests_max,
            reconnect_attempts_max=reconnect_attempts_max,
            connections_max=connections_max,
            socket_hwm_messages=socket_hwm_messages,
        )
        if type(operation_retries_max) is not int or operation_retries_max < 0:
            raise InvalidArgument(f"operation_retries_max must be an int >= 0, got {operation_retries_max!r}")
        self._rng = rng if rng is not None else random.Random()
        self._clock: Clock = clock if clock is not None else SystemClock()
        self.service_url = service_url
        self.client_name = client_name or f"danube-zmq-{secrets.token_hex(6)}"
        self.request_timeout_ms = request_timeout_ms
        self.operation_retries_max = operation_retries_max
        self.pending_requests_max = pending_requests_max
        self.reconnect_attempts_max = reconnect_attempts_max
        self.connections_max = connections_max
        self.socket_hwm_messages = socket_hwm_messages
        self.write_linger_us = write_linger_us
        # CURVE to every broker (one cluster server key); left None, from DANUBE_SERVER_KEY
        # and DANUBE_CLIENT_KEYS; without client keys, one fresh pair for this client.
        # use_env=False: a broker's own clients (the gRPC door's) act for a caller, with
        # that caller's credentials alone, never with what the broker's environment holds.
        env = os.environ if use_env else None
        self.curve: ClientCurve | None = client_curve(server_public_key, client_keys, env=env)
        self._tokens: TokenSource | None = token_source(token, token_provider, env=env)
        # A context of the caller's (a gRPC door's, shared by its many clients: no I/O
        # thread and descriptors each) is used, never destroyed; else one of our own.
        self._context: zmq.asyncio.Context | None = context
        self._owns_context = context is None
        self._connections: dict[str, Connection] = {}
        self._connect_lock = asyncio.Lock()
        self._producers: dict[Producer, None] = {}
        self._consumers: dict[Consumer, None] = {}
        self._closed = False
        self.schemas = SchemaCache(self._schema_request)

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Connect to the service URL (done on first use otherwise)."""
        await self._service_connection()

    async def close(self) -> None:
        """Close consumers, then producers (flushing them), then connections."""
        if self._closed:
            return
        self._closed = True
        for consumer in reversed(list(self._consumers)):
            await _quietly(consumer.close(), f"closing {consumer!r}")
        for producer in reversed(list(self._producers)):
            await _quietly(producer.close(), f"closing {producer!r}")
        for connection in reversed(list(self._connections.values())):
            await connection.close()
        self._connections.clear()
        if self._context is not None and self._owns_context:
            self._context.destroy(linger=0)
        self._context = None

    async def __aenter__(self) -> DanubeClient:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def statistics(self) -> ClientStatistics:
        return ClientStatistics(
            service_url=self.service_url,
            producers=len(self._producers),
            consumers=len(self._consumers),
            connections=tuple(c.statistics() for c in self._connections.values()),
        )

    # ---------------------------------------------------------------- producers, consumers

    async def create_producer(
        self,
        topic: str,
        *,
        name: str | None = None,
        dispatch: DispatchStrategy | str = DispatchStrategy.NON_RELIABLE,
        partitions: int | None = None,
        batching: bool = True,
        batch_messages_max: int = 1_000,
        batch_bytes_max: int = 1024 * 1024,
        batch_delay_ms: int = 10,
        pending_messages_max: int = 10_000,
        inflight_batches_max: int | None = None,
        schema_subject: str | None = None,
        schema_version: int | None = None,
        schema_min_version: int | None = None,
        on_batch: BatchCallback | None = None,
        chunking: bool = False,
        chunk_bytes_max: int | None = None,
        compression: str | None = None,
    ) -> Producer:
        """A producer on `topic`, created with `partitions` partitions and the `dispatch`
        strategy if the topic does not exist yet (when the broker auto-creates topics).
        `name` defaults to a generated unique one; on a partitioned topic partition i
        gets `{name}-{i}`. `inflight_batches_max` batches may await their receipts at once
        (default `RELIABLE_INFLIGHT_BATCHES` on reliable topics, 16 otherwise). Order is kept
        across retries and reconnects whatever the window: batches carry sequence numbers,
        a batch is sent again before any later one, and a reliable topic refuses the later
        ones until a refused batch comes again.

        `on_batch(receipt)`, if given, runs once per batch when its receipt or its failure
        arrives (a `BatchReceipt`: the offsets, or the error, and the message count), in
        send order per partition and before the messages' own callbacks: for accounting
        in bulk (a benchmark, a counter) without a call per message.

        Batching: a batch opened while nothing is in flight leaves on the event loop's
        next turn (with every message queued in that turn); one opened while batches are
        in flight fills until `batch_messages_max`, `batch_bytes_max`, the pipe draining,
        or `batch_delay_ms`, whichever comes first. Light traffic is not delayed and heavy
        traffic batches itself. `batch_bytes_max` is 1 MiB so that 1 KiB messages still
        fill 1,000 a batch: a reliable producer keeps at most `RELIABLE_INFLIGHT_BATCHES` (4)
        in flight, and at 128 KiB (125 such messages) each fsync round trip carried a
        fifth of what it can.

        With `schema_subject` (a registered subject) the producer writes that subject's
        version `schema_version`, or the latest if it is at least `schema_min_version`, or
        the latest; the version is fixed for the producer's life (all partitions, every
        reconnect). `send` then encodes values with it (bytes are sent as they are) and
        every message carries the schema id and version. The first producer naming a
        subject binds the topic to it; naming another subject fails with
        `FailedPrecondition`.

        `chunking`: a payload larger than the broker's message size (or
        `chunk_bytes_max`, for a topic whose `max_message_size` policy is lower) is sent
        as chunks of that size, in order to one partition, and a consumer hands it out
        whole (`chunks.py`); its `MessageId` is the first chunk's. Without it such a
        payload is refused (`InvalidArgument`).

        `compression` ("lz4", "zstd", "snappy" or "zlib"; Pulsar's `compressionType`):
        each message's payload is compressed here, after its schema's encoding and before
        chunking, and named in the reserved attribute `__compression`; consumers and
        readers decompress it (`transport/compression.py`). The broker's message size
        applies to the compressed bytes."""
        _check_name("topic", topic)
        _check_schema_choice(schema_subject, schema_version, schema_min_version)
        if name is not None:
            _check_name("name", name)
        strategy = parse_enum(dispatch, DispatchStrategy, "dispatch")
        if inflight_batches_max is None:
            # Reliable: a few batches in flight let a batch join the group commit running
            # when it is cut, instead of waiting for that commit's receipt first.
            inflight_batches_max = RELIABLE_INFLIGHT_BATCHES if strategy == DispatchStrategy.RELIABLE else 16
        if partitions is not None and (type(partitions) is not int or partitions < 0):
            raise InvalidArgument(f"partitions must be an int >= 0, got {partitions!r}")
        _check_positive(
            batch_messages_max=batch_messages_max,
            batch_bytes_max=batch_bytes_max,
            pending_messages_max=pending_messages_max,
            inflight_batches_max=inflight_batches_max,
        )
        if chunk_bytes_max is not None:
            _check_positive(chunk_bytes_max=chunk_bytes_max)
        if compression is not None:
            check_codec(compression)
        if chunking and strategy != DispatchStrategy.RELIABLE:
            raise InvalidArgument("chunking needs a reliable topic (as in Pulsar): a non-reliable one may drop a"
                                  " chunk, and the message with it")
        if type(batch_delay_ms) is not int or batch_delay_ms < 0:
            raise InvalidArgument(f"batch_delay_ms must be an int >= 0, got {batch_delay_ms!r}")
        self._check_open()
        names = await self._retry(
            lambda: self._get_partitions(topic, create=True, partitions=partitions or 0, dispatch=strategy)
        )
        producer = Producer(
            self,
            topic=topic,
            name=name or self._unique_name("producer"),
            dispatch=strategy,
            partition_topics=names,
            batching=bool(batching),
            batch_messages_max=batch_messages_max,
            batch_bytes_max=batch_bytes_max,
            batch_delay_ms=batch_delay_ms,
            pending_messages_max=pending_messages_max,
            inflight_batches_max=inflight_batches_max,
            schema_subject=schema_subject,
            schema_version=schema_version,
            schema_min_version=schema_min_version,
            on_batch=on_batch,
            chunking=bool(chunking),
            chunk_bytes_max=chunk_bytes_max,
            compression=compression,
        )
        await producer._start()
        self._producers[producer] = None
        return producer

    async def subscribe(
        self,
        topic: str,
        subscription: str,
        *,
        sub_type: SubType | str = SubType.SHARED,
        consumer_name: str | None = None,
        initial_position: InitialPosition | str = InitialPosition.LATEST,
        start_offset: int | None = None,
        key_filters: list[str] | None = None,
        receiver_queue_size: int = 1_000,
        ack_batch_max: int = 1_000,
        ack_delay_ms: int = 10,
        pending_acks_max: int = 10_000,
        reader_schema: bytes | str | None = None,
        durable: bool = True,
        max_pending_chunked_messages: int = 10,
        pending_chunked_bytes_max: int = 256 * 1024 * 1024,
        expire_incomplete_chunked_message_ms: int = 60_000,
        read_compacted: bool = False,
        decompressed_bytes_max: int = 256 * 1024 * 1024,
    ) -> Consumer:
        """A consumer of `subscription` on `topic` (every partition of it). A missing topic
        is created as its namespace's auto topic creation policy says (Pulsar's
        allowAutoTopicCreation; by default not partitioned, non-reliable), which needs the
        Produce permission a producer's create needs; `NotFound` where the policy is off
        (Danube's behaviour). A new subscription starts at `initial_position`
        ("latest" or "earliest"), or at `start_offset` on a reliable topic. An existing one
        resumes where it was. `receiver_queue_size` bounds the messages buffered here, and
        so the permits the broker holds, across all partitions. `Message.value()` decodes
        a message written with a schema by the writer's version (fetched once, cached),
        resolved against `reader_schema` when given (Avro: defaults fill added fields).
        `durable` False: a reader's subscription (`create_reader` makes those).

        Chunked messages (a producer's `chunking=True`) are put together here: at most
        `max_pending_chunked_messages` of them, and `pending_chunked_bytes_max` bytes
        of chunks, wait for their last chunk (past either the oldest is dropped); one
        whose next chunk does not come within `expire_incomplete_chunked_message_ms` is
        dropped (its producer died mid-way). A dropped one's chunks are acknowledged
        and logged (Pulsar's `maxPendingChunkedMessage`, `expireTimeOfIncompleteChunkedMessage`).

        `read_compacted` (Exclusive and Failover subscriptions of a reliable topic): below
        the topic's compaction horizon only the latest message per key is delivered (an
        admin's `topics compact`), then every message of the live tail.

        A payload its producer compressed (`create_producer(compression=)`) is handed out
        decompressed, its `__compression` attribute gone, up to `decompressed_bytes_max`
        bytes: one past it, or not valid data of its codec, is handed out as it came with
        an error logged."""
        _check_name("topic", topic)
        _check_name("subscription", subscription)
        if consumer_name is not None:
            _check_name("consumer_name", consumer_name)
        kind = parse_enum(sub_type, SubType, "sub_type")
        position = parse_enum(initial_position, InitialPosition, "initial_position")
        if start_offset is not None and (type(start_offset) is not int or start_offset < 0):
            raise InvalidArgument(f"start_offset must be an int >= 0, got {start_offset!r}")
        if key_filters is not None:
            key_filters = list(key_filters)
            if not all(isinstance(f, str) and f for f in key_filters):
                raise InvalidArgument(f"key_filters must be non-empty strs, got {key_filters!r}")
        _check_positive(
            receiver_queue_size=receiver_queue_size,
            ack_batch_max=ack_batch_max,
            pending_acks_max=pending_acks_max,
            max_pending_chunked_messages=max_pending_chunked_messages,
            pending_chunked_bytes_max=pending_chunked_bytes_max,
            expire_incomplete_chunked_message_ms=expire_incomplete_chunked_message_ms,
            decompressed_bytes_max=decompressed_bytes_max,
        )
        if type(ack_delay_ms) is not int or ack_delay_ms < 0:
            raise InvalidArgument(f"ack_delay_ms must be an int >= 0, got {ack_delay_ms!r}")
        if read_compacted and kind not in (SubType.EXCLUSIVE, SubType.FAILOVER):
            raise InvalidArgument(f"read_compacted applies to exclusive and failover subscriptions (and readers),"
                                  f" not {kind.name.lower()}")
        reader = reader_definition(reader_schema)
        self._check_open()
        names = await self._retry(lambda: self._partitions_to_subscribe(topic))
        consumer = Consumer(
            self,
            topic=topic,
            subscription=subscription,
            consumer_name=consumer_name or self._unique_name("consumer"),
            sub_type=kind,
            initial_position=position,
            start_offset=start_offset,
            key_filters=key_filters,
            partition_topics=names,
            receiver_queue_size=receiver_queue_size,
            ack_batch_max=ack_batch_max,
            ack_delay_ms=ack_delay_ms,
            pending_acks_max=pending_acks_max,
            reader_schema=reader,
            durable=durable,
            max_pending_chunked_messages=max_pending_chunked_messages,
            pending_chunked_bytes_max=pending_chunked_bytes_max,
            expire_incomplete_chunked_message_ms=expire_incomplete_chunked_message_ms,
            read_compacted=read_compacted,
            decompressed_bytes_max=decompressed_bytes_max,
        )
        await consumer._start()
        self._consumers[consumer] = None
        return consumer

    async def create_reader(
        self,
        topic: str,
        *,
        start: str | int = "latest",
        start_publish_time_ms: int | None = None,
        receiver_queue_size: int = 1_000,
        reader_schema: bytes | str | None = None,
        read_compacted: bool = False,
    ) -> Reader:
        """A reader of reliable `topic` (every partition of it), from `start`: "earliest",
        "latest" (the next message published) or an offset (one partition topic: offsets
        are per partition); or from the first message published at or after
        `start_publish_time_ms` (ms since the epoch). It holds no durable subscription,
        so it moves no cursor the broker keeps and holds no message back from retention.
        `read_compacted`: the compacted view below the topic's compaction horizon, as
        for `subscribe`."""
        if start_publish_time_ms is not None and (type(start_publish_time_ms) is not int or start_publish_time_ms < 0):
            raise InvalidArgument(f"start_publish_time_ms must be an int >= 0, got {start_publish_time_ms!r}")
        if isinstance(start, bool) or not (start in ("earliest", "latest") or (type(start) is int and start >= 0)):
            raise InvalidArgument(f"start must be 'earliest', 'latest' or an offset >= 0, got {start!r}")
        if start_publish_time_ms is not None and start != "latest":
            raise InvalidArgument("give start or start_publish_time_ms, not both")
        names = await self._retry(lambda: self._partitions_to_subscribe(topic))
        if type(start) is int and len(names) > 1:
            raise InvalidArgument(f"{topic} has {len(names)} partitions and offsets are per partition: start at"
                                  " earliest, latest or a publish time, or read one partition topic")
        position = "earliest" if start_publish_time_ms is not None or start == "earliest" else "latest"
        consumer = await self.subscribe(
            topic, self._unique_name("reader"), sub_type=SubType.EXCLUSIVE, initial_position=position,
            start_offset=start if type(start) is int else None, receiver_queue_size=receiver_queue_size,
            reader_schema=reader_schema, durable=False, read_compacted=read_compacted)
        try:
            check_reliable(consumer)
            if start_publish_time_ms is not None:
                await consumer.seek(publish_time=start_publish_time_ms)
        except BaseException:
            await consumer.close()
            raise
        return Reader(consumer)

    async def get_partitions(self, topic: str) -> list[str]:
        """The partition topics of an existing topic (`[topic]` if not partitioned)."""
        _check_name("topic", topic)
        self._check_open()
        return await self._retry(lambda: self._get_partitions(topic, create=False))

    async def get_topics(self, namespace: str) -> list[str]:
        """The topics of `namespace` by full name (`/ns/topic`), sorted, a partitioned
        topic once by its base name (Pulsar's getTopicsOfNamespace: what a pattern
        subscription matches its pattern against). Any broker answers the same. Needs
        Lookup on the namespace (a consumer's usual role holds it); the admin
        `list_topics` needs ManageTopic. NotFound: no such namespace.

        The broker answers a page at a time (up to 10,000 names each, docs/protocol.md);
        the pages are fetched in turn, each one retried as `get_partitions` is, so a
        topic created or deleted meanwhile may or may not be listed, and every other
        topic is listed once."""
        _check_name("namespace", namespace)
        self._check_open()
        topics: list[str] = []
        start_after: str | None = None
        while True:
            page = await self._retry(functools.partial(self._topics_page, namespace, start_after))
            if page.topics and start_after is not None and page.topics[0] <= start_after:
                raise InternalError(f"broker listed {page.topics[0]} after {start_after} in namespace {namespace}")
            topics.extend(page.topics)
            if not page.more:
                return topics
            if not page.topics:  # a page with more to come must move on, or this would never end
                raise InternalError(f"broker answered an empty page of namespace {namespace} with more to come")
            start_after = page.topics[-1]

    async def _topics_page(self, namespace: str, start_after: str | None) -> TopicsOfNamespace:
        reply = await self._request_on_service(
            GetTopicsOfNamespace(request_id=0, namespace=namespace, start_after=start_after))
        if not isinstance(reply, TopicsOfNamespace):
            raise InternalError(f"broker answered GetTopicsOfNamespace with {type(reply).__name__}")
        return reply

    # ---------------------------------------------------------------- internals

    def _check_open(self) -> None:
        if self._closed:
            raise AlreadyClosed("client is closed")

    def _unique_name(self, kind: str) -> str:
        return f"{kind}-{secrets.token_hex(6)}"

    def _forget(self, obj: Producer | Consumer) -> None:
        self._producers.pop(obj, None)  # type: ignore[call-overload]
        self._consumers.pop(obj, None)  # type: ignore[call-overload]

    async def _retry(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Run `operation`, retrying retriable failures with backoff."""
        attempt = 0
        while True:
            try:
                return await operation()
            except DanubeError as exc:
                if not exc.retriable or attempt >= self.operation_retries_max or self._closed:
                    raise
                log.info("retriable failure (%s: %s); retry %d", type(exc).__name__, exc, attempt + 1)
            await asyncio.sleep(backoff_ms(attempt, self._rng) / 1000)
            attempt += 1

    async def lookup(self, topic: str) -> str:
        """The URL of the broker serving `topic` (a topic without partitions, or one
        partition), as the service URL's broker answers: itself or a redirect."""
        _check_name("topic", topic)

        async def ask() -> str:
            reply = await self._request_on_service(Lookup(request_id=0, topic=topic))
            if not isinstance(reply, LookupResult):
                raise InternalError(f"broker answered Lookup with {type(reply).__name__}")
            return reply.broker_url

        return await self._retry(ask)

    async def _partitions_to_subscribe(self, topic: str) -> list[str]:
        """The topic's partitions; a missing topic is created by the broker's auto topic
        creation policy, asked in a second request so that only creating needs Produce."""
        try:
            return await self._get_partitions(topic, create=False)
        except NotFound:
            pass
        try:
            return await self._get_partitions(topic, create=True, for_subscription=True)
        except PermissionDenied as exc:
            raise NotFound(f"topic {topic} does not exist, and creating it by subscribing needs the Produce"
                           f" permission a producer's create needs: {exc}") from None

    async def _get_partitions(
        self,
        topic: str,
        *,
        create: bool,
        partitions: int = 0,
        dispatch: DispatchStrategy = DispatchStrategy.NON_RELIABLE,
        for_subscription: bool = False,
    ) -> list[str]:
        connection = await self._service_connection()
        reply = await connection.request(
            GetPartitions(
                request_id=0, topic=topic, create=create, partitions=partitions, dispatch_strategy=int(dispatch),
                for_subscription=for_subscription,
            )
        )
        if not isinstance(reply, Partitions):
            raise InternalError(f"broker answered GetPartitions with {type(reply).__name__}")
        if not reply.partitions:
            raise InternalError(f"broker returned no partitions for {topic}")
        return list(reply.partitions)

    async def _schema_request(self, msg: TransportMessage) -> TransportMessage:
        return await self._retry(lambda: self._request_on_service(msg))

    async def _request_on_service(self, msg: TransportMessage) -> TransportMessage:
        connection = await self._service_connection()
        return await connection.request(msg)

    async def _service_connection(self) -> Connection:
        return await self._connection(self.service_url)

    async def _connection(self, url: str) -> Connection:
        """The connection to `url`, opened (and handshaken) on first use."""
        self._check_open()
        connection = self._connections.get(url)
        if connection is not None and not connection.closed:
            return connection
        async with self._connect_lock:
            self._check_open()
            connection = self._connections.get(url)
            if connection is not None and not connection.closed:
                return connection
            if connection is not None:
                # Closed for good (gave up reconnecting): start afresh.
                del self._connections[url]
                await connection.close()
            if len(self._connections) >= self.connections_max:
                raise ResourceExhausted(f"already connected to {self.connections_max} brokers (connections_max)")
            if self._context is None:
                self._context = zmq.asyncio.Context()
            connection = Connection(
                url,
                context=self._context,
                client_name=self.client_name,
                request_timeout_ms=self.request_timeout_ms,
                pending_requests_max=self.pending_requests_max,
                reconnect_attempts_max=self.reconnect_attempts_max,
                socket_hwm_messages=self.socket_hwm_messages,
                clock=self._clock,
                rng=self._rng,
                write_linger_us=self.write_linger_us,
                curve=self.curve,
                tokens=self._tokens,
            )
            await connection.start()
            self._connections[url] = connection
            return connection

    def __repr__(self) -> str:
        return f"<DanubeClient {self.service_url!r} name={self.client_name!r}>"


async def _quietly(awaitable: Awaitable[None], what: str) -> None:
    """For teardown: one failing close must not stop the others; the failure is logged."""
    try:
        await awaitable
    except DanubeError as exc:
        log.warning("%s: %s", what, exc)

"""Schemas as a client uses them: fetched from the registry by `(schema_id, version)`
once, kept in a bounded cache, and used to encode what a producer sends and decode
what a consumer receives.

Producers encode with the version the broker resolved for them (`ProducerCreated`);
consumers decode with the version each message was written with, resolved against the
consumer's reader schema when it has one (Avro schema resolution: fields added with
defaults, removed, promoted). Bytes-like values are taken as already encoded.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from danube_zmq.schemas.formats import format_for
from danube_zmq.schemas.types import SchemaFormat, SchemaType
from danube_zmq.transport.client_protocol import GetSchema, SchemaInfo
from danube_zmq.transport.codec import Message
from danube_zmq.transport.errors import InternalError, InvalidArgument

__all__ = ["CachedSchema", "SchemaCache"]

_CACHE_MAX = 1024


@dataclass(frozen=True, slots=True)
class CachedSchema:
    subject: str
    schema_id: int
    version: int
    schema_type: SchemaType
    definition: bytes
    fmt: SchemaFormat

    def encode(self, value: Any) -> bytes:
        """A payload for `value`: bytes-like values are sent as they are (already
        encoded); anything else is encoded with this schema (checked on the way)."""
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        return self.fmt.encode(self.definition, value)

    def decode(self, payload: bytes, reader: bytes | None = None) -> Any:
        return self.fmt.decode(self.definition, payload, reader)


def _from_info(info: SchemaInfo) -> CachedSchema:
    kind = SchemaType(info.schema_type)
    return CachedSchema(subject=info.subject, schema_id=info.schema_id, version=info.version, schema_type=kind,
                        definition=info.definition, fmt=format_for(kind))


class SchemaCache:
    """`(schema_id, version)` -> `CachedSchema`, least recently used out beyond
    `limit`; concurrent misses on one key share one fetch."""

    def __init__(self, request: Callable[[Message], Awaitable[Message]], *, limit: int = _CACHE_MAX) -> None:
        self._request = request
        self._limit = limit
        self._schemas: OrderedDict[tuple[int, int], CachedSchema] = OrderedDict()
        self._fetching: dict[tuple[int, int], asyncio.Future[CachedSchema]] = {}
        self.fetches = 0

    def cached(self, schema_id: int, version: int) -> CachedSchema | None:
        found = self._schemas.get((schema_id, version))
        if found is not None:
            self._schemas.move_to_end((schema_id, version))
        return found

    async def get(self, schema_id: int, version: int) -> CachedSchema:
        found = self.cached(schema_id, version)
        if found is not None:
            return found
        key = (schema_id, version)
        pending = self._fetching.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[CachedSchema] = asyncio.get_running_loop().create_future()
        self._fetching[key] = future
        try:
            self.fetches += 1
            reply = await self._request(GetSchema(request_id=0, schema_id=schema_id, version=version))
            if not isinstance(reply, SchemaInfo) or (reply.schema_id, reply.version) != key:
                raise InternalError(f"broker answered GetSchema({schema_id}, {version}) with {reply!r:.80}")
            schema = _from_info(reply)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise
        finally:
            del self._fetching[key]
        self._schemas[key] = schema
        if len(self._schemas) > self._limit:
            self._schemas.popitem(last=False)
        future.set_result(schema)
        return schema


def reader_definition(reader_schema: bytes | str | None) -> bytes | None:
    """A consumer's reader schema as bytes (None: decode with the writer's schema)."""
    if reader_schema is None:
        return None
    if isinstance(reader_schema, str):
        return reader_schema.encode()
    if isinstance(reader_schema, bytes | bytearray | memoryview):
        return bytes(reader_schema)
    raise InvalidArgument(f"reader_schema must be a definition (bytes or str), not {type(reader_schema).__name__}")

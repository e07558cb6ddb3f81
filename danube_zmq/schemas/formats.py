"""The schema format for each `SchemaType` (imported on first use: the protobuf
format pulls in the protobuf compiler)."""

from __future__ import annotations

from danube_zmq.schemas.types import SchemaFormat, SchemaType

__all__ = ["format_for"]


def format_for(schema_type: SchemaType) -> SchemaFormat:
    if schema_type is SchemaType.AVRO:
        from danube_zmq.schemas.avro_format import AVRO

        return AVRO
    if schema_type is SchemaType.JSON_SCHEMA:
        from danube_zmq.schemas.json_format import JSON_SCHEMA

        return JSON_SCHEMA
    if schema_type is SchemaType.PROTOBUF:
        from danube_zmq.schemas.protobuf_format import PROTOBUF

        return PROTOBUF
    from danube_zmq.schemas.simple_formats import BYTES, NUMBER, STRING

    return {SchemaType.BYTES: BYTES, SchemaType.STRING: STRING, SchemaType.NUMBER: NUMBER}[schema_type]

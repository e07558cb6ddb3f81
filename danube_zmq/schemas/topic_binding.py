"""Which schema subject a topic is bound to, and how strictly its messages are checked
(Danube's topic schema context), kept in the metadata store next to the registry.

    /schemas/topics/{ns}/{topic}  msgpack: subject, validation_policy, payload_validation

- An admin binds a topic with `configure` (`danube admin topics configure-schema`), or
  the first producer that names a subject binds it (`bind_producer`, guarded by the key
  being absent, so two first producers racing on two brokers cannot both win). A later
  producer naming another subject is refused with FAILED_PRECONDITION: only an admin
  changes a topic's subject.
- `validation_policy`: `none` (no check), `warn` (log and count a message without the
  topic's schema, accept it), `enforce` (refuse it). `payload_validation`: decode each
  payload against its exact schema version and refuse an invalid one whatever the
  policy. A binding made by a producer starts as `warn` without payload validation,
  as in Danube.
- The binding is per topic name: it can be configured before the topic exists, and a
  partitioned topic's partitions share their base topic's binding.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import msgpack

from danube_zmq.consensus.metadata_store import MetadataStore
from danube_zmq.schemas.registry import SchemaRegistry, check_subject
from danube_zmq.transport.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from danube_zmq.transport.topic_name import parse_topic

__all__ = [
    "PREFIX",
    "TopicSchemaConfig",
    "ValidationPolicy",
    "bind_producer",
    "configure",
    "decode_entry",
    "get_config",
    "parse_policy",
]

_TOPICS = "/schemas/topics"
PREFIX = _TOPICS + "/"  # every binding's key starts with it (watched by the gateway)
_RETRIES_MAX = 16


class ValidationPolicy(enum.StrEnum):
    NONE = "none"
    WARN = "warn"
    ENFORCE = "enforce"


def parse_policy(text: str) -> ValidationPolicy:
    try:
        return ValidationPolicy(text.strip().lower())
    except ValueError:
        raise InvalidArgument(f"unknown validation policy {text!r}; expected none, warn or enforce") from None


@dataclass(frozen=True, slots=True)
class TopicSchemaConfig:
    topic: str
    subject: str
    validation_policy: ValidationPolicy
    payload_validation: bool
    revision: int = field(default=0, compare=False)  # the binding's mod revision in the store

    def encode(self) -> bytes:
        return msgpack.packb([self.subject, self.validation_policy.value, self.payload_validation])


def _base_topic(topic: str) -> str:
    return parse_topic(topic).base.full  # partitions share their base topic's binding


def _key(topic: str) -> str:
    return f"{_TOPICS}{_base_topic(topic)}"


def _decode(topic: str, data: bytes, revision: int) -> TopicSchemaConfig:
    subject, policy, payload = msgpack.unpackb(data)
    return TopicSchemaConfig(topic=_base_topic(topic), subject=subject, validation_policy=ValidationPolicy(policy),
                             payload_validation=payload, revision=revision)


def decode_entry(key: str, data: bytes, revision: int) -> TopicSchemaConfig:
    """A binding read from the store by key (a watch event, a prefix scan)."""
    return _decode(key[len(_TOPICS):], data, revision)


async def get_config(store: MetadataStore, topic: str) -> TopicSchemaConfig | None:
    """The topic's binding, or None when no schema is bound to it."""
    value = await store.get(_key(topic))
    return None if value is None else _decode(topic, value.value, value.mod_revision)


async def configure(
    store: MetadataStore, registry: SchemaRegistry, topic: str, subject: str, policy: ValidationPolicy,
    payload_validation: bool,
) -> TopicSchemaConfig:
    """An admin's binding: replaces whatever was there. The subject must be registered."""
    base = _base_topic(topic)  # INVALID_ARGUMENT for a bad name before any lookup
    check_subject(subject)
    await registry.get_latest(subject)  # NOT_FOUND for an unknown subject, before anything changes
    config = TopicSchemaConfig(topic=base, subject=subject, validation_policy=policy,
                               payload_validation=payload_validation)
    written = await store.put(_key(topic), config.encode())
    return TopicSchemaConfig(topic=config.topic, subject=subject, validation_policy=policy,
                             payload_validation=payload_validation, revision=written.mod_revision)


async def bind_producer(store: MetadataStore, registry: SchemaRegistry, topic: str, subject: str) -> TopicSchemaConfig:
    """A producer names `subject` for `topic`: bind the topic if it has no subject yet,
    accept if it is bound to this one, refuse (FAILED_PRECONDITION) otherwise."""
    check_subject(subject)
    try:
        await registry.get_latest(subject)
    except NotFound:
        raise FailedPrecondition(f"schema subject {subject!r} is not registered; register it first") from None
    for _attempt in range(_RETRIES_MAX):
        current = await get_config(store, topic)
        if current is not None:
            if current.subject != subject:
                raise FailedPrecondition(
                    f"topic {current.topic} is bound to schema subject {current.subject!r}, not {subject!r};"
                    " only an admin changes a topic's subject (danube admin topics configure-schema)"
                )
            return current
        config = TopicSchemaConfig(topic=_base_topic(topic), subject=subject, validation_policy=ValidationPolicy.WARN,
                                   payload_validation=False)
        await store.transaction({_key(topic): 0}, {_key(topic): config.encode()})
        # Won or lost, the next read returns the binding with its revision.
    raise Unavailable(f"the schema binding of {topic} kept changing; retry")

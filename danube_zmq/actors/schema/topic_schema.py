"""Schemas at produce time: what the gateway resolves for a producer, and the check a
topic actor runs on every `Send` of a topic bound to a schema subject.

    CreateProducer(schema_subject, schema_version | schema_min_version)
        -> gateway task: `resolve_producer_schema` (registry + topic binding, a few
           metadata-store reads; binds the topic for its first producer naming a subject)
        -> ClientRequest(schema=ProducerSchema) -> broker -> topic actor
    topic actor: the producer writes `(schema_id, version)`, stamped on its messages;
        `TopicSchemaGuard.check` applies the topic's validation policy and payload
        validation to each batch.

Binding changes made after producers attached (an admin's `configure-schema`, on any
broker) reach topic actors from the watch of the bindings, a `MetadataWatch` child of
the client gateway (`spawn_binding_watch`): `TopicSchemaChanged` -> gateway -> broker ->
the topic's actors. Each state carries the binding's metadata revision, so a stale
one (a producer's context read before a change the watch already delivered) never
replaces a newer one.

Policy (Danube's `validate_message`):
- `none`: no check of the message's schema;
- `warn`: a batch without the topic's schema is accepted, counted and logged;
- `enforce`: such a batch is refused with FAILED_PRECONDITION.
Payload validation, when enabled, decodes every payload of a batch written with the
topic's subject against its exact version and refuses the batch with INVALID_ARGUMENT
naming the message and the field at fault, whatever the policy. Validating one batch may
take `limits.schema_validation_budget_ms`: past it the rest of the batch is not looked at
and the batch is refused with INVALID_ARGUMENT, so a batch of many costly payloads holds
the event loop about that long at most (each payload's own check is linear in its size:
jsonschema-rs's regex engine does not backtrack). A topic with policy
`none` and no payload validation has no guard at all: its send path does not change.
"""

from __future__ import annotations

import logging
import time

from danube_zmq.actors.cluster.metadata_watch import MetadataWatch
from danube_zmq.actors.metrics import METRICS
from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.consensus.state_machine import WatchEvent
from danube_zmq.runtime.system import ActorSystem
from danube_zmq.schemas import topic_binding
from danube_zmq.schemas.formats import format_for
from danube_zmq.schemas.registry import SchemaRegistry
from danube_zmq.schemas.topic_binding import ValidationPolicy
from danube_zmq.schemas.types import SchemaFormat, SchemaType
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.codec import Message
from danube_zmq.transport.compression import COMPRESSION, decompress
from danube_zmq.transport.errors import DanubeError, FailedPrecondition, InvalidArgument, NotFound
from danube_zmq.transport.internal_protocol import (
    ProducerSchema,
    SchemaVersionRef,
    TopicSchemaChanged,
    TopicSchemaState,
)

__all__ = ["TopicSchemaGuard", "binding_state", "resolve_producer_schema", "spawn_binding_watch"]

log = logging.getLogger("danube_zmq.topic")

# A warn-policy topic logs the first mismatched batch and then one in this many.
_WARN_LOG_EVERY = 1000


async def binding_state(registry: SchemaRegistry, config: topic_binding.TopicSchemaConfig) -> TopicSchemaState:
    summary = await registry.summary(config.subject)
    return TopicSchemaState(subject=config.subject, schema_id=summary.schema_id,
                            validation_policy=config.validation_policy.value,
                            payload_validation=config.payload_validation, revision=config.revision)


async def spawn_binding_watch(system: ActorSystem, metadata: RaftMetadataStore, registry: SchemaRegistry,
                              gateway: str) -> str:
    """A `MetadataWatch` of the topics' schema bindings, child of the client `gateway`,
    telling it a `TopicSchemaChanged` per change (the gateway passes it to the broker).
    Each binding's state is resolved in the watch's own task (a registry read), so the
    gateway never waits on the store. It follows the changes from the revision of its
    first spawn (a topic learns its binding when it starts; this watch tells it the
    later changes), a restart included; past a compacted history it tells every
    binding again."""
    since = metadata.local_revision()

    async def changed(event: WatchEvent) -> Message | None:
        topic = event.key[len(topic_binding.PREFIX) - 1:]
        if event.value is None:
            return TopicSchemaChanged(topic=topic, revision=event.revision, state=None)
        config = topic_binding.decode_entry(event.key, event.value.value, event.value.mod_revision)
        try:
            state = await binding_state(registry, config)
        except DanubeError as exc:
            log.warning("schema binding of %s names subject %r: %s", topic, config.subject, exc)
            return None
        return TopicSchemaChanged(topic=topic, revision=event.revision, state=state)

    async def listing() -> list[Message]:
        told = []
        for key, value in await metadata.list_prefix(topic_binding.PREFIX, linearizable=False):  # after the barrier
            message = await changed(WatchEvent(revision=value.mod_revision, kind=0, key=key, value=value,
                                               prev_version=0))
            if message is not None:
                told.append(message)
        return told

    return await system.spawn(lambda: MetadataWatch(metadata=metadata, prefix=topic_binding.PREFIX, target=gateway,
                                                    start_over=listing, on_event=changed, since=since),
                              name="schema bindings watch", parent=gateway)


async def resolve_producer_schema(registry: SchemaRegistry, msg: cp.CreateProducer) -> ProducerSchema:
    """The schema context of a new producer: the version it writes and the topic's binding.

    A producer naming a subject gets its version resolved first (pinned, minimum or
    latest; an invalid one fails creation before anything is bound), then binds the topic
    if nothing is bound yet. A producer without a subject still learns the binding, so
    the topic enforces it."""
    topic, subject = msg.topic, msg.schema_subject
    for what, value in (("schema_version", msg.schema_version), ("schema_min_version", msg.schema_min_version)):
        if value is not None and value < 1:
            raise InvalidArgument(f"{what} must be >= 1, got {value}")
    store = registry.store
    if subject is None:
        if msg.schema_version is not None or msg.schema_min_version is not None:
            raise InvalidArgument("a schema version or minimum version needs a schema_subject")
        config = await topic_binding.get_config(store, topic)
        if config is None:
            return ProducerSchema(topic=None, version=None)
        return ProducerSchema(topic=await binding_state(registry, config), version=None)
    try:
        await registry.summary(subject)
    except NotFound:
        raise FailedPrecondition(f"schema subject {subject!r} is not registered; register it first"
                                 " (danube schemas register)") from None
    chosen = await registry.resolve(subject, pinned=msg.schema_version, min_version=msg.schema_min_version)
    config = await topic_binding.bind_producer(store, registry, topic, subject)
    version = SchemaVersionRef(schema_id=chosen.schema_id, version=chosen.version,
                               schema_type=chosen.schema_type.value, definition=chosen.definition)
    return ProducerSchema(topic=await binding_state(registry, config), version=version)


class TopicSchemaGuard:
    """The checks of one topic bound to a subject; see the module docstring."""

    def __init__(self, topic: str, state: TopicSchemaState, *, budget_ms: int = 200,
                 decompressed_bytes_max: int = 16 * 1024 * 1024) -> None:
        self.topic = topic
        self.budget_s = budget_ms / 1000
        # A compressed payload is validated decompressed, within this (the frame's bound).
        self.decompressed_bytes_max = decompressed_bytes_max
        self.update(state)
        # Definitions of the subject's versions producers attached with, for payload validation.
        self.versions: dict[int, tuple[SchemaFormat, bytes]] = {}
        self.mismatched_batches = 0
        self._mismatched = METRICS.schema_mismatched.labels(topic=topic)
        self._rejected = METRICS.schema_rejected.labels(topic=topic)

    def update(self, state: TopicSchemaState) -> None:
        """A new policy for the same subject (learned versions stay)."""
        self.state = state
        self.policy = ValidationPolicy(state.validation_policy)

    @property
    def active(self) -> bool:
        """False: nothing to check (policy none, no payload validation)."""
        return self.policy is not ValidationPolicy.NONE or self.state.payload_validation

    def learn(self, ref: SchemaVersionRef) -> None:
        if ref.schema_id == self.state.schema_id:
            self.versions[ref.version] = (format_for(SchemaType(ref.schema_type)), ref.definition)

    def check(self, schema_id: int | None, version: int | None, payloads: list[bytes],
              attributes: list[dict[str, str] | None] | None = None) -> None:
        """Raise if the batch may not be stored; count a tolerated mismatch. A payload
        whose attributes name a compression is validated decompressed (the only place
        the broker decompresses: it stores what came)."""
        state = self.state
        if schema_id != state.schema_id:
            if self.policy is ValidationPolicy.NONE:
                return
            written = "no schema" if schema_id is None else f"schema id {schema_id}"
            if self.policy is ValidationPolicy.ENFORCE:
                self._rejected.inc(len(payloads))
                raise FailedPrecondition(
                    f"topic {self.topic} enforces schema subject {state.subject!r} (schema id {state.schema_id});"
                    f" this producer writes {written}: create it with schema_subject={state.subject!r}")
            self.mismatched_batches += 1
            self._mismatched.inc(len(payloads))
            if self.mismatched_batches % _WARN_LOG_EVERY == 1:
                log.warning("%s: a batch with %s accepted on a topic bound to schema subject %r (policy warn;"
                            " %d such batches so far)", self.topic, written, state.subject, self.mismatched_batches)
            return
        if not state.payload_validation:
            return
        assert version is not None
        known = self.versions.get(version)
        if known is None:
            raise InvalidArgument(f"schema {state.subject!r} version {version} is not known to topic {self.topic};"
                                  " re-create the producer")
        fmt, definition = known
        deadline = time.monotonic() + self.budget_s
        for index, payload in enumerate(payloads):
            if index and time.monotonic() > deadline:
                self._rejected.inc(len(payloads))
                raise InvalidArgument(
                    f"validating this batch against schema {state.subject!r} version {version} took over"
                    f" {round(self.budget_s * 1000)} ms ({index} of {len(payloads)} messages checked;"
                    " limits.schema_validation_budget_ms): send smaller batches")
            codec = attributes[index].get(COMPRESSION) if attributes is not None and attributes[index] else None
            try:
                fmt.validate(definition, payload if codec is None else
                             decompress(codec, payload, self.decompressed_bytes_max))
            except InvalidArgument as exc:
                self._rejected.inc(len(payloads))
                where = f"message {index} of the batch" if len(payloads) > 1 else "the message"
                raise InvalidArgument(f"{where} does not match schema {state.subject!r} version {version}:"
                                      f" {exc.message}") from None

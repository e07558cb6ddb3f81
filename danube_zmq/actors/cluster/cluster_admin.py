"""Answers to the admin API's metadata-cluster requests (`danube admin cluster ...`,
`danube admin metadata ...`, `danube admin topics configure-schema|get-schema-config`),
served from this broker's Raft peer and the schema registry kept in it.

One function per request type; the admin gateway's `handle_<Type>` calls it in a task
of its own (these wait on Raft: a commit, a read index), so a slow metadata round never holds up the broker actor. Writes and
membership changes sent to a follower are forwarded to the leader by the peer itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.consensus.state_machine import VersionedValue
from danube_zmq.schemas import topic_binding
from danube_zmq.schemas.registry import SchemaRegistry
from danube_zmq.transport.admin_protocol import (
    AddClusterNode,
    ClusterMember,
    ClusterStatus,
    ClusterStatusInfo,
    ConfigureTopicSchema,
    GetTopicSchemaConfig,
    MetadataCompareAndSwap,
    MetadataDelete,
    MetadataEntries,
    MetadataEntry,
    MetadataGet,
    MetadataList,
    MetadataPut,
    MetadataWritten,
    PromoteClusterNode,
    RemoveClusterNode,
    TopicSchemaConfigInfo,
)
from danube_zmq.transport.codec import Message
from danube_zmq.transport.errors import DanubeError, InvalidArgument, NotFound

_LIST_LIMIT_MAX = 100_000


Answer = Callable[[RaftMetadataStore, SchemaRegistry, Any], Awaitable[Message]]
"""One cluster request's answer (the admin gateway's `handle_<Type>` names which);
errors are raised as `DanubeError`s."""


async def configure_topic_schema(store: RaftMetadataStore, registry: SchemaRegistry,
                                 msg: ConfigureTopicSchema) -> Message:
    config = await topic_binding.configure(store, registry, msg.topic, msg.subject,
                                           topic_binding.parse_policy(msg.validation_policy), msg.payload_validation)
    return await _schema_config(registry, msg.request_id, config)


async def get_topic_schema_config(store: RaftMetadataStore, registry: SchemaRegistry,
                                  msg: GetTopicSchemaConfig) -> Message:
    found = await topic_binding.get_config(store, msg.topic)
    if found is None:
        raise NotFound(f"no schema is bound to {msg.topic}")
    return await _schema_config(registry, msg.request_id, found)


async def cluster_status(store: RaftMetadataStore, registry: SchemaRegistry, msg: ClusterStatus) -> Message:
    return status(store, msg.request_id)


async def add_cluster_node(store: RaftMetadataStore, registry: SchemaRegistry, msg: AddClusterNode) -> Message:
    await store.add_node(msg.node_id, msg.address)
    return status(store, msg.request_id)


async def promote_cluster_node(store: RaftMetadataStore, registry: SchemaRegistry,
                               msg: PromoteClusterNode) -> Message:
    await store.promote_node(msg.node_id)
    return status(store, msg.request_id)


async def remove_cluster_node(store: RaftMetadataStore, registry: SchemaRegistry, msg: RemoveClusterNode) -> Message:
    await store.remove_node(msg.node_id)
    return status(store, msg.request_id)


async def metadata_get(store: RaftMetadataStore, registry: SchemaRegistry, msg: MetadataGet) -> Message:
    _check_key(msg.key)
    value = await store.get(msg.key, linearizable=msg.linearizable)
    entries = [] if value is None else [_entry(msg.key, value)]
    return MetadataEntries(request_id=msg.request_id, entries=entries, revision=store.revision)


async def metadata_list(store: RaftMetadataStore, registry: SchemaRegistry, msg: MetadataList) -> Message:
    limit = msg.limit
    if not 1 <= limit <= _LIST_LIMIT_MAX:
        raise InvalidArgument(f"limit must be between 1 and {_LIST_LIMIT_MAX}, got {limit}")
    items = await store.list_prefix(msg.prefix, linearizable=msg.linearizable)
    return MetadataEntries(request_id=msg.request_id, entries=[_entry(k, v) for k, v in items[:limit]],
                           revision=store.revision, more=len(items) > limit)


async def metadata_put(store: RaftMetadataStore, registry: SchemaRegistry, msg: MetadataPut) -> Message:
    _check_key(msg.key)
    if msg.ttl_ms is None:
        written = await store.put(msg.key, msg.value)
    else:
        written = await store.put_with_ttl(msg.key, msg.value, msg.ttl_ms)
    return MetadataWritten(request_id=msg.request_id, succeeded=True, entry=_entry(msg.key, written))


def start_metadata_put(store: RaftMetadataStore, msg: MetadataPut,
                       answer: Callable[[Message | DanubeError], None]) -> bool:
    """A plain put on the leader, proposed at once and answered from its apply (no task,
    no wake-ups between: the common write's path). False when this broker does not lead
    or the put has a TTL: then `metadata_put` answers it."""
    if msg.ttl_ms is not None:
        return False
    _check_key(msg.key)

    def done(outcome: VersionedValue | DanubeError) -> None:
        if isinstance(outcome, DanubeError):
            answer(outcome)
        else:
            answer(MetadataWritten(request_id=msg.request_id, succeeded=True, entry=_entry(msg.key, outcome)))

    return store.put_then(msg.key, msg.value, done)


async def metadata_compare_and_swap(store: RaftMetadataStore, registry: SchemaRegistry,
                                    msg: MetadataCompareAndSwap) -> Message:
    _check_key(msg.key)
    cas = await store.compare_and_swap(msg.key, msg.expected_version, msg.value)
    entry = None if cas.value is None else _entry(msg.key, cas.value)
    return MetadataWritten(request_id=msg.request_id, succeeded=cas.succeeded, entry=entry)


async def metadata_delete(store: RaftMetadataStore, registry: SchemaRegistry, msg: MetadataDelete) -> Message:
    if msg.prefix:
        deleted = await store.delete_prefix(msg.key)
    else:
        _check_key(msg.key)
        deleted = int(await store.delete(msg.key))
    return MetadataWritten(request_id=msg.request_id, succeeded=deleted > 0, deleted=deleted)


async def _schema_config(registry: SchemaRegistry, rid: int, config: topic_binding.TopicSchemaConfig) -> Message:
    summary = await registry.summary(config.subject)
    return TopicSchemaConfigInfo(request_id=rid, topic=config.topic, subject=config.subject,
                                 validation_policy=config.validation_policy.value,
                                 payload_validation=config.payload_validation, schema_id=summary.schema_id,
                                 latest_version=summary.latest_version, schema_type=str(summary.schema_type),
                                 compatibility=str(summary.compatibility))


def status(store: RaftMetadataStore, request_id: int) -> ClusterStatusInfo:
    peer = store.peer
    stats = peer.statistics()
    leader = stats.leader_id
    return ClusterStatusInfo(
        request_id=request_id,
        node_id=stats.node_id,
        role=stats.role,
        term=stats.term,
        leader_id=leader,
        leader_address=peer.addresses.get(leader) if leader is not None else None,
        commit_index=stats.commit_index,
        applied_index=stats.applied_index,
        last_index=stats.last_index,
        revision=store.revision,
        members=[ClusterMember(node_id=m.node_id, address=m.address, voter=m.voter, match_index=m.match_index)
                 for m in peer.members()],
    )


def _check_key(key: str) -> None:
    if not key:
        raise InvalidArgument("a metadata key must not be empty")


def _entry(key: str, value: VersionedValue) -> MetadataEntry:
    return MetadataEntry(key=key, value=value.value, version=value.version, mod_revision=value.mod_revision,
                         create_revision=value.create_revision, ttl_ms=value.ttl_ms)

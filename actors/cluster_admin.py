"""Answers to the admin API's metadata-cluster requests (`danube admin cluster ...`,
`danube admin metadata ...`, `danube admin topics configure-schema|get-schema-config`),
served from this broker's Raft peer and the schema registry kept in it.

The admin gateway calls `answer` in a task per request (these wait on Raft: a commit, a
read index), so a slow metadata round never holds up the broker actor. Writes and
membership changes sent to a follower are forwarded to the leader by the peer itself.
"""

from __future__ import annotations

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
from danube_zmq.transport.errors import InvalidArgument, NotFound

__all__ = ["answer", "status"]

_LIST_LIMIT_MAX = 100_000


async def answer(store: RaftMetadataStore, registry: SchemaRegistry, msg: Message) -> Message:
    """The reply to one cluster request; errors are raised as `DanubeError`s."""
    rid: int = msg.request_id  # type: ignore[attr-defined]
    match msg:
        case ConfigureTopicSchema(topic=topic, subject=subject, validation_policy=policy,
                                  payload_validation=payload_validation):
            config = await topic_binding.configure(store, registry, topic, subject,
                                                   topic_binding.parse_policy(policy), payload_validation)
            return await _schema_config(registry, rid, config)
        case GetTopicSchemaConfig(topic=topic):
            found = await topic_binding.get_config(store, topic)
            if found is None:
                raise NotFound(f"no schema is bound to {topic}")
            return await _schema_config(registry, rid, found)
        case ClusterStatus():
            return status(store, rid)
        case AddClusterNode(node_id=node_id, address=address):
            await store.add_node(node_id, address)
            return status(store, rid)
        case PromoteClusterNode(node_id=node_id):
            await store.promote_node(node_id)
            return status(store, rid)
        case RemoveClusterNode(node_id=node_id):
            await store.remove_node(node_id)
            return status(store, rid)
        case MetadataGet(key=key, linearizable=linearizable):
            _check_key(key)
            value = await store.get(key, linearizable=linearizable)
            entries = [] if value is None else [_entry(key, value)]
            return MetadataEntries(request_id=rid, entries=entries, revision=store.revision)
        case MetadataList(prefix=prefix, linearizable=linearizable, limit=limit):
            if not 1 <= limit <= _LIST_LIMIT_MAX:
                raise InvalidArgument(f"limit must be between 1 and {_LIST_LIMIT_MAX}, got {limit}")
            items = await store.list_prefix(prefix, linearizable=linearizable)
            return MetadataEntries(request_id=rid, entries=[_entry(k, v) for k, v in items[:limit]],
                                   revision=store.revision, more=len(items) > limit)
        case MetadataPut(key=key, value=value, ttl_ms=ttl_ms):
            _check_key(key)
            if ttl_ms is None:
                written = await store.put(key, value)
            else:
                written = await store.put_with_ttl(key, value, ttl_ms)
            return MetadataWritten(request_id=rid, succeeded=True, entry=_entry(key, written))
        case MetadataCompareAndSwap(key=key, expected_version=expected, value=value):
            _check_key(key)
            cas = await store.compare_and_swap(key, expected, value)
            entry = None if cas.value is None else _entry(key, cas.value)
            return MetadataWritten(request_id=rid, succeeded=cas.succeeded, entry=entry)
        case MetadataDelete(key=key, prefix=prefix):
            if prefix:
                deleted = await store.delete_prefix(key)
            else:
                _check_key(key)
                deleted = int(await store.delete(key))
            return MetadataWritten(request_id=rid, succeeded=deleted > 0, deleted=deleted)
    raise InvalidArgument(f"{type(msg).__name__} is not a cluster request")


async def _schema_config(registry: SchemaRegistry, rid: int, config: topic_binding.TopicSchemaConfig) -> Message:
    summary = await registry.summary(config.subject)
    return TopicSchemaConfigInfo(request_id=rid, topic=config.topic, subject=config.subject,
                                 validation_policy=config.validation_policy.value,
                                 payload_validation=config.payload_validation, schema_id=summary.schema_id,
                                 latest_version=summary.latest_version)


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

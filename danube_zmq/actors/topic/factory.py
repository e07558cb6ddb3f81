"""One factory for topic actors: the shell with the storage side its strategy needs."""

from __future__ import annotations

from concurrent.futures import Executor
from pathlib import Path

from danube_zmq.actors.ids import IdSource
from danube_zmq.actors.topic.memory_tail import MemoryTail
from danube_zmq.actors.topic.shell import TopicActor
from danube_zmq.actors.topic.storage import TopicStorage
from danube_zmq.actors.topic.wal import WalStorage
from danube_zmq.config.broker_config import BrokerConfig
from danube_zmq.transport import client_protocol as cp
from danube_zmq.transport.internal_protocol import ApplyTopicPolicies, DurableSegment


def make_topic(*, name: str, dispatch_strategy: int, config: BrokerConfig, rng: IdSource, broker_endpoint: str,
               start_offset: int | None = None, wal_dir: Path | None = None, executor: Executor | None = None,
               cursor_endpoint: str | None = None, durable: list[DurableSegment] | None = None,
               cache_dir: Path | None = None, backlog_quota: tuple[int, str] | None = None,
               policies: ApplyTopicPolicies | None = None) -> TopicActor:
    """A reliable topic (`dispatch_strategy` RELIABLE) stores in its WAL under `wal_dir`
    (its flushes run on `executor`) and resumes the subscriptions `cursor_endpoint` (the
    broker's cursor flusher; the broker by default) has for it, and tells it their
    cursors; any other keeps a bounded in-memory tail. `start_offset`: where the topic's
    previous owner stopped (its offsets continue from there). `policies`: those in force
    (the broker's `policies` by default)."""
    cursor_endpoint = cursor_endpoint or broker_endpoint
    storage: TopicStorage
    if dispatch_strategy == cp.DispatchStrategy.RELIABLE:
        assert wal_dir is not None and executor is not None, "a reliable topic needs a WAL directory and an executor"
        storage = WalStorage(name=name, config=config, wal_dir=wal_dir, executor=executor, durable=durable,
                             cache_dir=cache_dir, start_offset=start_offset, backlog_quota=backlog_quota)
    else:
        storage = MemoryTail(config=config, start_offset=start_offset or 0)
    return TopicActor(name=name, config=config, rng=rng, broker_endpoint=broker_endpoint, storage=storage,
                      cursor_endpoint=cursor_endpoint, policies=policies)

"""The cursor flusher: the actor that writes what a broker's topics ask it to store.

A child of the broker actor, spawned before any topic. It owns the records not written
yet to the metadata store: the cursors of reliable subscriptions (`PersistCursor`,
`ForgetSubscription`, from the subscriptions and topics), the records of attached
producers (`ProducerRegistry`, forwarded by the broker for the topics it serves) and
the damage records the store refused (`RecordDamage`). Each is coalesced by key, so
what it holds is bounded by the subscriptions, producers and damaged topics served
here, not by the rate of acks.

1. A `Tick` timer message every `storage.cursor_flush_interval_ms` (scheduled again
   after each flush, so at most one waits in the mailbox) writes the damage records,
   then the cursors and producer records in transactions of at most the store's
   `batch_keys_max` keys. One mailbox serializes the
   flushes: a newer cursor is never overwritten by an older one, and what the store
   refused is kept (under anything newer told meanwhile) for the next timer.
2. `FlushCursors` (an ask) writes everything told so far now: the broker asks before a
   seal, a hand-over, or answering an admin request that changed a policy.
3. `SubscriptionsOf` (an ask, from a reliable topic at each start) answers the topic's
   subscriptions from the local replica with the unwritten cursors over them: a topic
   loaded again, or restarted, before a flush resumes from its newest cursors.
4. Stopping: children stop newest first (`ActorSystem.stop`), so this one, spawned
   first, stops after every topic; what the topics told on their way out is in its
   mailbox, handled before `on_stop` writes it all (`test_cursor_flusher.py`).
"""

from __future__ import annotations

import logging

from danube_zmq.consensus.metadata_store import RaftMetadataStore
from danube_zmq.runtime.actor import Actor
from danube_zmq.storage.catalog import topic_key
from danube_zmq.transport import cluster_records as cr
from danube_zmq.transport.errors import DanubeError, InvalidArgument
from danube_zmq.transport.internal_protocol import (
    ClearProducers,
    Done,
    FlushCursors,
    ForgetDamage,
    ForgetSubscription,
    ForgetTopicRecords,
    PersistCursor,
    PersistedSubscriptions,
    ProducerRegistry,
    RecordDamage,
    SubscriptionsOf,
    SubscriptionState,
    Tick,
)

__all__ = ["CursorFlusher", "subscription_key"]

log = logging.getLogger("danube_zmq.broker")


def subscription_key(topic: str, subscription: str) -> str:
    # Not storage.catalog.cursor_key: the record holds the subscription's type too.
    return f"{topic_key(topic)}/subscriptions/{subscription}"


class CursorFlusher(Actor):
    def __init__(self, *, metadata: RaftMetadataStore, broker_id: int, interval_ms: int) -> None:
        self.metadata = metadata
        self.broker_id = broker_id
        self.interval_ms = interval_ms
        self.cursors: dict[str, bytes | None] = {}  # subscription key -> record (None: delete)
        self.producers: dict[str, bytes | None] = {}  # producer record key -> record (None: delete)
        self.damage: dict[str, bytes] = {}  # topic -> its damage record the store refused

    async def on_start(self) -> None:
        self.system.schedule_once(self.endpoint, self.interval_ms, Tick())

    async def on_stop(self) -> None:
        try:
            await self._flush()
        except DanubeError as exc:
            log.error("cursors not written at shutdown (%s): subscriptions resume from the last written ones", exc)

    # ------------------------------------------------------------- what is told
    def handle_PersistCursor(self, msg: PersistCursor) -> None:
        self.cursors[subscription_key(msg.topic, msg.subscription)] = cr.encode(cr.CursorRecord(
            sub_type=msg.sub_type, cursor=msg.cursor, acked_above=msg.acked_above, policy=msg.policy,
            max_unacked_messages=msg.max_unacked_messages, delayed=msg.delayed))

    def handle_ForgetSubscription(self, msg: ForgetSubscription) -> None:
        self.cursors[subscription_key(msg.topic, msg.subscription)] = None

    def handle_ProducerRegistry(self, msg: ProducerRegistry) -> None:
        self.producers[cr.producer_key(msg.topic, msg.producer_id)] = cr.encode(cr.ProducerRecord(
            producer_id=msg.producer_id, producer_name=msg.producer_name, topic=msg.topic,
            access_mode=msg.access_mode, broker_id=self.broker_id)) if msg.attached else None

    def handle_ClearProducers(self, msg: ClearProducers) -> None:
        for key, _ in self.metadata.local_scan(cr.producers_prefix(msg.topic)):
            self.producers[key] = None

    def handle_ForgetTopicRecords(self, msg: ForgetTopicRecords) -> None:
        prefix = f"{topic_key(msg.topic)}/"
        for pending in (self.cursors, self.producers):
            for key in [k for k in pending if k.startswith(prefix)]:
                del pending[key]

    def handle_RecordDamage(self, msg: RecordDamage) -> None:
        self.damage[msg.topic] = msg.record

    def handle_ForgetDamage(self, msg: ForgetDamage) -> None:
        self.damage.pop(msg.topic, None)

    # ------------------------------------------------------------- writing
    async def handle_Tick(self, msg: Tick) -> None:
        try:
            await self._flush()
        except DanubeError as exc:
            log.warning("cursors not written (%s); retrying at the next flush", exc)
        finally:
            self.system.schedule_once(self.endpoint, self.interval_ms, Tick())

    async def handle_FlushCursors(self, msg: FlushCursors) -> Done:
        await self._flush()
        return Done()

    async def _flush(self) -> None:
        await self._write_damage()
        if not self.cursors and not self.producers:
            return
        cursors, self.cursors = self.cursors, {}
        producers, self.producers = self.producers, {}
        writes = list({**cursors, **producers}.items())
        # In transactions of at most batch_keys_max keys: a busy broker moves more cursors
        # in one interval than the store takes at once, and a larger batch is refused whole
        # (every flush after it too). Each record stands alone, so no atomicity is lost.
        step = max(1, self.metadata.batch_keys_max)
        written = 0
        try:
            for start in range(0, len(writes), step):
                chunk = writes[start:start + step]
                await self.metadata.transaction({}, {k: v for k, v in chunk if v is not None},
                                                [k for k, v in chunk if v is None])
                written = start + len(chunk)
        except BaseException:  # refused or cancelled (a shutdown): kept for the next flush
            done = {k for k, _ in writes[:written]}
            cursors = {k: v for k, v in cursors.items() if k not in done}
            cursors.update(self.cursors)  # told while the write was on its way: newer
            self.cursors = cursors
            producers = {k: v for k, v in producers.items() if k not in done}
            producers.update(self.producers)
            self.producers = producers
            raise

    async def _write_damage(self) -> None:
        # Only a record keeps the load manager and unloads off a damaged topic: written
        # again until the store takes it. A refusal ends the flush: the store is out of
        # reach, and each write would wait out its own timeout.
        for topic, record in list(self.damage.items()):
            try:
                await self.metadata.put(cr.damaged_key(topic), record)
            except DanubeError as exc:
                log.warning("topic %s: its damage still not recorded (%s); retrying", topic, exc)
                raise
            self.damage.pop(topic, None)
            log.info("topic %s: its damage is recorded in the metadata store", topic)

    # ------------------------------------------------------------- reading
    def handle_SubscriptionsOf(self, msg: SubscriptionsOf) -> PersistedSubscriptions:
        prefix = f"{topic_key(msg.topic)}/subscriptions/"
        records: dict[str, bytes | None] = {key: value.value for key, value in self.metadata.local_scan(prefix)}
        records.update((k, v) for k, v in self.cursors.items() if k.startswith(prefix))
        states = []
        for key, value in sorted(records.items()):
            if value is None:
                continue  # forgotten, not deleted yet
            try:
                record = cr.decode_cursor(value)
            except InvalidArgument as exc:  # the topic is not served from a cursor it cannot read
                raise InvalidArgument(f"metadata record {key} cannot be read ({exc}); fix or delete it"
                                      f" (danube admin metadata get/delete {key})") from None
            states.append(SubscriptionState(name=key[len(prefix):].split("/")[0], sub_type=record.sub_type,
                                            cursor=record.cursor, acked_above=record.acked_above,
                                            policy=record.policy, max_unacked_messages=record.max_unacked_messages,
                                            delayed=record.delayed))
        return PersistedSubscriptions(states=states)

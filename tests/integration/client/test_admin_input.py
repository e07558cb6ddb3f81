"""Admin input stays inside its root (issue 19, section 7), against a real broker.

Every admin operation that takes a name or id is sent, on a raw admin socket (no client
side check in the way), each hostile value: traversal, an absolute path, inner
traversal, `..`, a NUL byte, URL-encoded dots and a 10,000-character id. Each is
answered with a clear error (INVALID_ARGUMENT, or NOT_FOUND where the value is a valid
name of that field, as `/etc/passwd` is a topic name), no actor crashes, the broker keeps
answering and a canary directory beside the data dir is untouched.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from danube_zmq.transport import admin_protocol as ap
from danube_zmq.transport.admin_protocol import ADMIN_PROTOCOL
from danube_zmq.transport.client_protocol import DispatchStrategy
from danube_zmq.transport.codec import Message
from danube_zmq.transport.common import Error, Ok
from danube_zmq.transport.errors import ErrorCode

HOSTILE = {
    "traversal": "../../../victim",
    "absolute": "/etc/passwd",
    "inner-traversal": "a/../../b",
    "dotdot": "..",
    "nul": "snap\0shot",
    "url-encoded-dots": "%2e%2e%2f%2e%2e",
    "10k-chars": "x" * 10_000,
}

TOPIC = "/default/canary-topic"  # a reliable topic that exists
SUB = "canary-sub"

# Every admin request with a name or id field: (operation, field) -> request for a value.
OPERATIONS: dict[str, Callable[[int, str], Message]] = {
    "CreateNamespace.namespace": lambda rid, v: ap.CreateNamespace(request_id=rid, namespace=v),
    "DeleteNamespace.namespace": lambda rid, v: ap.DeleteNamespace(request_id=rid, namespace=v),
    "ListTopics.namespace": lambda rid, v: ap.ListTopics(request_id=rid, namespace=v),
    "CreateTopic.topic": lambda rid, v: ap.CreateTopic(request_id=rid, topic=v,
                                                       dispatch_strategy=int(DispatchStrategy.RELIABLE)),
    "DeleteTopic.topic": lambda rid, v: ap.DeleteTopic(request_id=rid, topic=v),
    "DescribeTopic.topic": lambda rid, v: ap.DescribeTopic(request_id=rid, topic=v),
    "UnloadTopic.topic": lambda rid, v: ap.UnloadTopic(request_id=rid, topic=v),
    "ListSubscriptions.topic": lambda rid, v: ap.ListSubscriptions(request_id=rid, topic=v),
    "Unsubscribe.topic": lambda rid, v: ap.Unsubscribe(request_id=rid, topic=v, subscription=SUB),
    "Unsubscribe.subscription": lambda rid, v: ap.Unsubscribe(request_id=rid, topic=TOPIC, subscription=v),
    "SeekSubscription.topic": lambda rid, v: ap.SeekSubscription(request_id=rid, topic=v, subscription=SUB,
                                                                 offset=0),
    "SeekSubscription.subscription": lambda rid, v: ap.SeekSubscription(request_id=rid, topic=TOPIC,
                                                                        subscription=v, offset=0),
    "SetFailurePolicy.subscription": lambda rid, v: _failure_policy(rid, TOPIC, v, None),
    "SetFailurePolicy.dead_letter_topic": lambda rid, v: _failure_policy(rid, TOPIC, SUB, v),
    "GetFailurePolicy.topic": lambda rid, v: ap.GetFailurePolicy(request_id=rid, topic=v, subscription=SUB),
    "GetFailurePolicy.subscription": lambda rid, v: ap.GetFailurePolicy(request_id=rid, topic=TOPIC,
                                                                        subscription=v),
    "SetDispatchConfig.subscription": lambda rid, v: ap.SetDispatchConfig(request_id=rid, topic=TOPIC,
                                                                          subscription=v, max_unacked_messages=5),
    "GetDispatchConfig.subscription": lambda rid, v: ap.GetDispatchConfig(request_id=rid, topic=TOPIC,
                                                                          subscription=v),
    "ConfigureTopicSchema.topic": lambda rid, v: ap.ConfigureTopicSchema(request_id=rid, topic=v, subject="s"),
    "ConfigureTopicSchema.subject": lambda rid, v: ap.ConfigureTopicSchema(request_id=rid, topic=TOPIC, subject=v),
    "GetTopicSchemaConfig.topic": lambda rid, v: ap.GetTopicSchemaConfig(request_id=rid, topic=v),
    "AddClusterNode.address": lambda rid, v: ap.AddClusterNode(request_id=rid, node_id=7, address=v),
    "CreateSnapshot.topic": lambda rid, v: ap.CreateSnapshot(request_id=rid, topic=v),
    "DescribeSnapshot.snapshot_id": lambda rid, v: ap.DescribeSnapshot(request_id=rid, snapshot_id=v),
    "DeleteSnapshot.snapshot_id": lambda rid, v: ap.DeleteSnapshot(request_id=rid, snapshot_id=v),
    "RepairTopic.topic": lambda rid, v: ap.RepairTopic(request_id=rid, topic=v, accept_loss=True),
    "ReassignTopic.topic": lambda rid, v: ap.ReassignTopic(request_id=rid, topic=v, force=True),
    "SetBacklogQuota.namespace": lambda rid, v: ap.SetBacklogQuota(request_id=rid, limit_bytes=1 << 20,
                                                                   policy="producer_exception", namespace=v),
    "SetBacklogQuota.topic": lambda rid, v: ap.SetBacklogQuota(request_id=rid, limit_bytes=1 << 20,
                                                               policy="producer_exception", topic=v),
    "GetBacklogQuota.namespace": lambda rid, v: ap.GetBacklogQuota(request_id=rid, namespace=v),
    "GetBacklogQuota.topic": lambda rid, v: ap.GetBacklogQuota(request_id=rid, topic=v),
    "RemoveBacklogQuota.namespace": lambda rid, v: ap.RemoveBacklogQuota(request_id=rid, namespace=v),
    "RemoveBacklogQuota.topic": lambda rid, v: ap.RemoveBacklogQuota(request_id=rid, topic=v),
    # Broker to broker (a local-mode move), on the same admin port.
    "BeginHandOver.topic": lambda rid, v: _begin_handover(rid, v, "00000000000000000000.wal"),
    "HandOverFile.name": lambda rid, v: _begin_handover(rid, TOPIC, v),
    "HandOverChunk.topic": lambda rid, v: ap.HandOverChunk(request_id=rid, topic=v, handover_id=1, file_index=0,
                                                           position=0, data=b"x", crc32c=0),
    "CommitHandOver.topic": lambda rid, v: ap.CommitHandOver(request_id=rid, topic=v, handover_id=1),
    "AbortHandOver.topic": lambda rid, v: ap.AbortHandOver(request_id=rid, topic=v, handover_id=1),
}


def _begin_handover(rid: int, topic: str, file_name: str) -> Message:
    return ap.BeginHandOver(request_id=rid, topic=topic, handover_id=1,
                            files=[ap.HandOverFile(name=file_name, size_bytes=1)], next_offset=0)

# `/etc/passwd` is a well-formed topic name (namespace `etc`) and topic glob: it names
# nothing here, and is never a path.
VALID_NAME_OF_FIELD = {(op, "absolute") for op in OPERATIONS if op.endswith((".topic", ".dead_letter_topic"))}


def _failure_policy(rid: int, topic: str, subscription: str, dead_letter: str | None) -> Message:
    return ap.SetFailurePolicy(request_id=rid, topic=topic, subscription=subscription, max_redelivery_count=3,
                               ack_timeout_ms=30_000, base_redelivery_delay_ms=100, max_redelivery_delay_ms=1000,
                               backoff="exponential", poison_policy="dead_letter" if dead_letter else "block",
                               dead_letter_topic=dead_letter)


class RawAdmin:
    """One admin DEALER socket sending encoded requests as a hostile user would."""

    def __init__(self, url: str) -> None:
        self._sock = zmq.Context.instance().socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.RCVTIMEO, 30_000)  # generous: a slow machine is not a failure
        self._sock.connect(url)
        self._ids = itertools.count(1)

    def ask(self, build: Callable[[int], Message]) -> Message:
        rid = next(self._ids)
        self._sock.send(ADMIN_PROTOCOL.encode(build(rid)))
        while True:
            reply = ADMIN_PROTOCOL.decode(self._sock.recv())
            if getattr(reply, "request_id", None) == rid:
                return reply

    def close(self) -> None:
        self._sock.close(linger=0)


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A directory beside the broker's data dir (`tmp_path/data`), reachable from the
    snapshot location by `../../../victim`, with a file a describe could leak."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "manifest.json").write_text('{"secret": "canary"}')
    return victim


def _canary_intact(victim: Path) -> None:
    assert sorted(p.name for p in victim.iterdir()) == ["manifest.json"]
    assert (victim / "manifest.json").read_text() == '{"secret": "canary"}'


def _alive(admin: RawAdmin) -> None:
    reply = admin.ask(lambda rid: ap.ListNamespaces(request_id=rid))
    assert isinstance(reply, ap.NamespaceList) and "default" in reply.namespaces


def test_every_admin_name_or_id_refuses_hostile_values(broker, canary) -> None:
    """The table: every (operation, field) x hostile value gets INVALID_ARGUMENT (or
    NOT_FOUND for a value that is a valid name of that field), the broker keeps
    answering, no actor crashed (no handler raised in the broker's log) and the canary
    outside the data dir is untouched."""
    admin = RawAdmin(broker.admin_url)
    try:
        created = admin.ask(lambda rid: ap.CreateTopic(request_id=rid, topic=TOPIC,
                                                       dispatch_strategy=int(DispatchStrategy.RELIABLE)))
        assert isinstance(created, Ok), created
        wrong: list[str] = []
        for (op, build), (kind, value) in itertools.product(OPERATIONS.items(), HOSTILE.items()):
            reply = admin.ask(lambda rid, b=build, v=value: b(rid, v))
            expected = {ErrorCode.INVALID_ARGUMENT}
            if (op, kind) in VALID_NAME_OF_FIELD:
                expected = {ErrorCode.INVALID_ARGUMENT, ErrorCode.NOT_FOUND}
            if not isinstance(reply, Error) or reply.code not in expected:
                wrong.append(f"{op} {kind}: {reply!r}"[:300])
            elif len(reply.message) > 600:
                wrong.append(f"{op} {kind}: a {len(reply.message)}-character message echoes the input")
        assert not wrong, "\n".join(wrong)
        _alive(admin)
    finally:
        admin.close()
    _canary_intact(canary)
    assert "raised" not in broker.log(), broker.log()[-3000:]


def test_nul_ids_beyond_the_restart_budget_leave_the_snapshot_service_working(broker, canary) -> None:
    """Twelve NUL-byte snapshot ids (the restart budget is 5 in 60 s) are each answered
    INVALID_ARGUMENT; then the snapshot service still takes, lists, describes and deletes
    a snapshot."""
    admin = RawAdmin(broker.admin_url)
    try:
        for _ in range(12):
            for make in (ap.DescribeSnapshot, ap.DeleteSnapshot):
                reply = admin.ask(lambda rid, m=make: m(request_id=rid, snapshot_id="a\0b"))
                assert isinstance(reply, Error) and reply.code == ErrorCode.INVALID_ARGUMENT, reply
        created = admin.ask(lambda rid: ap.CreateSnapshot(request_id=rid))
        assert isinstance(created, ap.SnapshotCreated), created
        snapshot_id = created.snapshot.snapshot_id
        listed = admin.ask(lambda rid: ap.ListSnapshots(request_id=rid))
        assert isinstance(listed, ap.SnapshotList) and [s.snapshot_id for s in listed.snapshots] == [snapshot_id]
        described = admin.ask(lambda rid: ap.DescribeSnapshot(request_id=rid, snapshot_id=snapshot_id))
        assert isinstance(described, ap.SnapshotDescription) and snapshot_id in described.manifest
        assert isinstance(admin.ask(lambda rid: ap.DeleteSnapshot(request_id=rid, snapshot_id=snapshot_id)), Ok)
    finally:
        admin.close()
    _canary_intact(canary)
    assert "raised" not in broker.log(), broker.log()[-3000:]


def test_cli_snapshot_delete_of_a_traversal_is_one_clear_error(broker, canary) -> None:
    """The reported command, `danube admin snapshots delete ../../../victim`, exits
    non-zero with one `error:` line naming the rule and leaves the canary in place;
    `describe` of it does not print the canary's manifest."""
    for verb in ("delete", "describe"):
        done = subprocess.run([sys.executable, "-m", "danube_zmq.cli.main", "admin", "--endpoint", broker.admin_url,
                               "snapshots", verb, "../../../victim"], capture_output=True, text=True, timeout=60)
        assert done.returncode != 0
        assert done.stderr.strip().splitlines()[-1].startswith("error:"), done.stderr
        assert "invalid snapshot id" in done.stderr and "canary" not in done.stdout + done.stderr
    _canary_intact(canary)


def test_a_handed_over_file_name_never_escapes_the_data_dir(broker, tmp_path: Path) -> None:
    """A hand-over offering `../../x.wal` (or an absolute name) for an existing reliable
    topic is refused INVALID_ARGUMENT and nothing is written outside the data dir; a
    hand-over of a topic that does not exist is NOT_FOUND and leaves no staging
    directory behind."""
    admin = RawAdmin(broker.admin_url)
    try:
        assert isinstance(admin.ask(lambda rid: ap.CreateTopic(
            request_id=rid, topic=TOPIC, dispatch_strategy=int(DispatchStrategy.RELIABLE))), Ok)
        before = sorted(str(p) for p in tmp_path.rglob("*") if "data" not in p.relative_to(tmp_path).parts[:1])
        for name in ("../../x.wal", "../../../x.wal", "/tmp/x.wal", "00000000000000000000.wal/../../x.wal"):
            reply = admin.ask(lambda rid, n=name: _begin_handover(rid, TOPIC, n))
            assert isinstance(reply, Error) and reply.code == ErrorCode.INVALID_ARGUMENT, (name, reply)
        reply = admin.ask(lambda rid: _begin_handover(rid, "/default/no-such-topic", "00000000000000000000.wal"))
        assert isinstance(reply, Error) and reply.code == ErrorCode.NOT_FOUND, reply
        assert not list(tmp_path.rglob("no-such-topic"))
        after = sorted(str(p) for p in tmp_path.rglob("*") if "data" not in p.relative_to(tmp_path).parts[:1])
        assert after == before and not list(tmp_path.rglob("x.wal"))
    finally:
        admin.close()

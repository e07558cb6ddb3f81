"""The broker configuration: typed, documented field by field, validated at load.

One frozen keyword-only dataclass per YAML section; `BrokerConfig` holds them.
Each class checks its own fields in `__post_init__` (types, ranges, relations),
so a config object that exists is valid, however it was built.

`load_config` merges four sources, each overriding the one before:

1. the defaults written below;
2. a YAML file (`config/danube_broker.yml` is the commented sample with every key);
3. environment variables `DANUBE_<SECTION>__<KEY>` (`DANUBE_BROKER__LISTEN`,
   `DANUBE_POLICIES__MAX_MESSAGE_SIZE`) and `DANUBE_<KEY>` for top-level keys
   (`DANUBE_AUTO_CREATE_TOPICS`). Values are read as YAML scalars, so `false`
   and `42` work; list values are YAML flow lists (`[default, tenant1]`) or
   comma-separated. Only names of known keys are read: other `DANUBE_*`
   variables (`DANUBE_SERVICE_URL` of the client) are none of our business;
4. overrides: dotted keys (`{"broker.listen": "tcp://..."}`) from CLI flags;
   None values mean "flag not given" and are skipped.

Every mistake is a `ConfigError` whose message names the key, and where the
bad value came from (file and line, environment variable, or overrides).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import yaml

from danube_zmq.storage.wal.format import RECORD_BODY_BYTES_MAX
from danube_zmq.transport.errors import ConfigError, InvalidArgument
from danube_zmq.transport.topic_name import parse_topic, validate_namespace

__all__ = [
    "ENVELOPE_BYTES_MAX",
    "MIB",
    "BrokerConfig",
    "BrokerSection",
    "ClusterSection",
    "DispatchSection",
    "LimitsSection",
    "PoliciesSection",
    "SecuritySection",
    "env_var_name",
    "load_config",
]

KIB = 1024
MIB = 1024 * KIB
# Room a frame needs around the largest message: wire envelope, topic name,
# producer name, attributes. `limits.frame_bytes_max` must exceed
# `policies.max_message_size` by more than this.
ENVELOPE_BYTES_MAX = 1 * MIB
# Largest value of any integer key: what fits an int64 (ZeroMQ's int64 socket
# options, msgpack). Keys passed to a C `int` option use _C_INT_MAX.
_INT_MAX = 2**63 - 1
_C_INT_MAX = 2**31 - 1
_PORT_MAX = 65535
_ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://")
_ENV_PREFIX = "DANUBE_"


# --------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------


EVENT_LOOPS = ("uvloop", "asyncio")


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerSection:
    """Identity and endpoints of this broker (Danube's `broker:` section)."""

    SECTION: ClassVar[str] = "broker"

    # Id of this broker in the cluster, an integer in 0..2**63-1. Default None:
    # a random id is drawn at start (from the broker's injected random.Random).
    broker_id: int | None = None
    # ZeroMQ endpoint the broker binds for clients (Danube's client port 6650).
    # tcp://0.0.0.0:6650 listens on every interface; port 0 or * picks a free one.
    # Default tcp://127.0.0.1:6650. Must differ from admin_listen.
    listen: str = "tcp://127.0.0.1:6650"
    # ZeroMQ endpoint the broker binds for the admin API (Danube's admin port
    # 50051). Default tcp://127.0.0.1:50051. Must differ from listen.
    admin_listen: str = "tcp://127.0.0.1:50051"
    # Endpoint clients and other brokers are told to connect to, for when the
    # bound address is not reachable as written (0.0.0.0, NAT, containers).
    # Default None: the same as listen (see `advertised`).
    advertised_url: str | None = None
    # TCP port of the Prometheus metrics HTTP endpoint (on metrics_host),
    # 1..65535; 0 disables metrics. Default 9040 (Danube's prometheus port).
    metrics_port: int = 9040
    # Directory for everything the broker keeps on disk (WAL, metadata),
    # relative to the working directory. Default ./danube-data.
    data_dir: str = "./danube-data"
    # A client connection that sends nothing, not even a ping, for this long is
    # closed: its producers and consumers are detached (Failover promotes the
    # next consumer). Default 5000 ms. Must be at least 2 x heartbeat_interval_ms.
    session_timeout_ms: int = 5000
    # How often clients are told to ping the broker. Default 1000 ms.
    heartbeat_interval_ms: int = 1000
    # The asyncio event loop: "uvloop" (libuv; used when installed, else the
    # standard loop) or "asyncio" (the standard library's). Default uvloop.
    event_loop: str = "uvloop"
    # Interface the metrics endpoint binds: an IPv4 or IPv6 address or a host name.
    # Default 127.0.0.1 (loopback: only this host can scrape); 0.0.0.0 for every
    # interface, best with TLS and basic auth (security.metrics_*).
    metrics_host: str = "127.0.0.1"
    # Metrics requests served at once, one thread each; one more connection is
    # closed at once. 1..1024, default 16.
    metrics_connections_max: int = 16
    # Topics (partitions) with series of their own (`topic` label); series of topics
    # beyond it add up in one `topic="_other"` child, so a broker serving 100,000
    # partitions does not export millions of series. 0..1,000,000, default 1,000.
    metrics_topics_max: int = 1_000
    # Subscriptions of each named topic with series of their own (`subscription`
    # label, about 27 series each); the topic's others add up in one
    # `subscription="_other"` child, so a principal that may only consume cannot grow
    # /metrics by making subscriptions. Per topic: one tenant never pushes another
    # topic's subscriptions out of their names. 0: none by name (Pulsar's
    # exposeConsumerLevelMetricsInPrometheus off). 0..1,000,000, default 10.
    metrics_subscriptions_max: int = 10
    # Also export prometheus_client's process and runtime families after danube's:
    # process_* (resident memory, CPU seconds, open and maximum file descriptors: what an
    # operator alerts on, and what Prometheus' standard dashboards read), python_info and
    # python_gc_*. About 25 lines a scrape. Default true; false: only danube_* families.
    metrics_process_collectors: bool = True
    # libzmq I/O threads of the broker's ZeroMQ context: they move every byte of every
    # socket, and with security.mode curve they also encrypt and decrypt it, so on a
    # secured broker with spare cores a second one takes that work off the first.
    # 1..16, default 1 (docs/performance.md "Security overhead" has the measurement).
    io_threads: int = 1
    # Danube's gRPC client door (docs/danube-compat.md): http://HOST:PORT the broker
    # binds for Danube's own clients (danube-client, danube-cli), serving DanubeApi.proto
    # as a gateway into this broker's client port. Port 0 picks a free one. Default None:
    # off, nothing is bound and the gRPC modules are not even imported.
    grpc_listen: str | None = None
    # http(s)://HOST:PORT Danube clients are told (lookup answers, other brokers' redirects)
    # when grpc_listen is not reachable as written. Default None: the bound address.
    grpc_advertised_url: str | None = None
    # Producers and consumers the gRPC door holds at once (each is one attachment on the
    # client port); one more is refused RESOURCE_EXHAUSTED. 1..100,000, default 1,000.
    grpc_attachments_max: int = 1_000
    # Danube's gRPC admin door (docs/danube-compat.md): http://HOST:PORT the broker binds
    # for Danube's admin tools, serving DanubeAdmin.proto as a gateway into this broker's
    # admin port (broker.admin_listen). Port 0 picks a free one. Default None: off,
    # nothing is bound and the gRPC modules are not even imported.
    grpc_admin_listen: str | None = None
    # TCP connections the gRPC client door holds at once, TLS or HTTP/2 handshake done
    # or not; one more is closed at once by grpc itself (nothing read from it). Counted
    # with the native ports against the broker's file descriptors: the broker refuses
    # to start when the doors' share does not fit RLIMIT_NOFILE (docs/security.md).
    # 1..1,000,000, default 1,000.
    grpc_connections_max: int = 1_000
    # The same for the gRPC admin door. 1..1,000,000, default 64.
    grpc_admin_connections_max: int = 64
    # A connection to either gRPC door that has not finished its TLS handshake and sent
    # its HTTP/2 settings within this is closed (an HTTP/2 GOAWAY, then the socket).
    # 100..600,000, default 5,000 ms.
    grpc_handshake_timeout_ms: int = 5_000
    # A connection to either gRPC door with no call open for this long is closed (a
    # GOAWAY; Danube's clients dial again when they next call). Danube's client health-
    # checks every 5 s while it holds a producer or consumer, so only an unused
    # connection goes. 1,000..86,400,000, default 60,000 ms.
    grpc_idle_timeout_ms: int = 60_000

    def __post_init__(self) -> None:
        _check_types(self)
        if self.event_loop not in EVENT_LOOPS:
            raise _error("broker.event_loop", f"must be one of {', '.join(EVENT_LOOPS)}, got {self.event_loop!r}")
        _check_range("broker.heartbeat_interval_ms", self.heartbeat_interval_ms, 10, 3_600_000)
        _check_range("broker.session_timeout_ms", self.session_timeout_ms, 20, 3_600_000)
        if self.session_timeout_ms < 2 * self.heartbeat_interval_ms:
            raise _error(
                "broker.session_timeout_ms",
                f"must be at least 2 x broker.heartbeat_interval_ms ({2 * self.heartbeat_interval_ms}),"
                f" got {self.session_timeout_ms}",
                "broker.heartbeat_interval_ms",
            )
        if self.broker_id is not None:
            _check_range("broker.broker_id", self.broker_id, 0, _INT_MAX)
        _check_endpoint("broker.listen", self.listen)
        _check_endpoint("broker.admin_listen", self.admin_listen)
        if self.advertised_url is not None:
            _check_endpoint("broker.advertised_url", self.advertised_url)
        if self.listen == self.admin_listen and not _is_ephemeral(self.listen):
            raise _error(
                "broker.admin_listen",
                f"must differ from broker.listen, both are {self.listen!r}",
                "broker.listen",
            )
        _check_range("broker.metrics_port", self.metrics_port, 0, _PORT_MAX)
        if not self.metrics_host or any(c.isspace() or c in "/[]" for c in self.metrics_host):
            raise _error("broker.metrics_host", f"must be an address or host name, got {self.metrics_host!r}")
        _check_range("broker.metrics_connections_max", self.metrics_connections_max, 1, 1024)
        _check_range("broker.metrics_topics_max", self.metrics_topics_max, 0, 1_000_000)
        _check_range("broker.metrics_subscriptions_max", self.metrics_subscriptions_max, 0, 1_000_000)
        _check_range("broker.io_threads", self.io_threads, 1, 16)
        if self.grpc_listen is not None:
            _check_http_endpoint("broker.grpc_listen", self.grpc_listen)
        if self.grpc_advertised_url is not None:
            # https:// for a door serving TLS (or behind a proxy that does): Danube's
            # tools pick TLS from the scheme they are told.
            _check_http_endpoint("broker.grpc_advertised_url", self.grpc_advertised_url, ("http", "https"))
        _check_range("broker.grpc_attachments_max", self.grpc_attachments_max, 1, 100_000)
        _check_range("broker.grpc_connections_max", self.grpc_connections_max, 1, 1_000_000)
        _check_range("broker.grpc_admin_connections_max", self.grpc_admin_connections_max, 1, 1_000_000)
        _check_range("broker.grpc_handshake_timeout_ms", self.grpc_handshake_timeout_ms, 100, 600_000)
        _check_range("broker.grpc_idle_timeout_ms", self.grpc_idle_timeout_ms, 1_000, 86_400_000)
        if self.grpc_admin_listen is not None:
            _check_http_endpoint("broker.grpc_admin_listen", self.grpc_admin_listen)
            if self.grpc_listen == self.grpc_admin_listen and not self.grpc_admin_listen.endswith(":0"):
                raise _error("broker.grpc_admin_listen", f"must differ from broker.grpc_listen, both are"
                             f" {self.grpc_listen!r}", "broker.grpc_listen")
        if not self.data_dir:
            raise _error("broker.data_dir", "must not be empty")

    @property
    def advertised(self) -> str:
        """The endpoint to give to clients: advertised_url, or listen if unset."""
        return self.advertised_url if self.advertised_url is not None else self.listen


@dataclass(frozen=True, slots=True, kw_only=True)
class LimitsSection:
    """Bounds on connections, frames and queues (STYLE 8: a limit on everything)."""

    SECTION: ClassVar[str] = "limits"

    # Largest ZeroMQ frame accepted or sent, in bytes; bigger frames are
    # refused. Default 16 MiB, at most 64 MiB (a WAL record's bound). Must be
    # greater than policies.max_message_size + 1 MiB, the room for the envelope
    # around the largest message; clients take it from the broker at connect.
    # Raising it may need inbound_bytes_per_connection_max and mailbox_bytes_max
    # raised (docs/operations.md, "Large messages").
    frame_bytes_max: int = 16 * MIB
    # Client connections open at once; one more is refused with
    # RESOURCE_EXHAUSTED. Default 10000.
    connections_max: int = 10000
    # Messages waiting in one actor's mailbox; a full mailbox is backpressure
    # on the sender. Default 10000. Applies to every actor's mailbox.
    mailbox_messages_max: int = 10000
    # Bytes the messages waiting in one actor's mailbox may carry (a client's
    # frames, a batch's payloads; counted once, when a message is sent). Past it
    # the mailbox refuses more as when full by count: a producer's batch is
    # answered RESOURCE_EXHAUSTED (retriable), an actor sending waits. At least
    # frame_bytes_max, so that the largest frame passes a mailbox not empty.
    # Default 64 MiB.
    mailbox_bytes_max: int = 64 * MIB
    # Producers one client connection may open at once. Default 1000.
    producers_per_connection_max: int = 1000
    # Consumers one client connection may open at once. Default 1000.
    consumers_per_connection_max: int = 1000
    # Frames queued for sending to one client connection (the ZeroMQ send
    # high-water mark, ZMQ_SNDHWM); a slow client past this is backpressured.
    # Default 10000. At least 1: ZeroMQ reads 0 as "unbounded". At most
    # 2**31-1, ZMQ_SNDHWM being a C int.
    outbound_frames_max: int = 10000
    # Bytes queued in ZeroMQ for one client connection and not yet written to
    # its socket. At half of this the connection's consumers are paused (no
    # more deliveries, whatever their permits); frames past it are refused
    # and counted; the consumers resume at a quarter. One frame always passes
    # to an empty queue. Default 32 MiB.
    outbound_bytes_per_connection_max: int = 32 * MIB
    # The same over all client connections of the broker; a frame past it is
    # refused and its connection paused. At least
    # outbound_bytes_per_connection_max. Default 512 MiB.
    outbound_bytes_max: int = 512 * MIB
    # A connection paused this long (it does not read its socket) is
    # disconnected: its session ends, its consumers' unacknowledged messages
    # go back for redelivery, and ZeroMQ drops its queue. Default 30000.
    outbound_stall_timeout_ms: int = 30_000
    # TCP connections to the client port that have not sent `Connect` yet,
    # at once; one more is disconnected at once. Default 1000.
    connections_pending_max: int = 1000
    # A connection that has no session (never sent `Connect`, or its session
    # ended) is disconnected after this long. Default 10000.
    connect_timeout_ms: int = 10_000
    # Bytes ZeroMQ has read from one connection (client or admin port) and not
    # yet handed to the broker: an unfinished multipart message, or whole
    # messages the broker has not caught up with. Checked by a watcher process
    # (the broker's child) every 5 ms on the connections that received data
    # (the kernel's count of bytes received against the bytes handed); a
    # connection over it is disconnected. More than frame_bytes_max. Default 64 MiB.
    inbound_bytes_per_connection_max: int = 64 * MIB
    # The same summed over all connections of both ports; past it the
    # connections holding the most are disconnected until the sum is under it.
    # At least inbound_bytes_per_connection_max. Default 256 MiB.
    inbound_bytes_max: int = 256 * MIB
    # Whether the watcher process holds the two budgets above. Off (false), the
    # broker starts where it cannot run (its descriptor copies, pidfd_getfd, are
    # refused: a container's seccomp profile, Yama ptrace_scope 2-3), and nothing
    # bounds what ZeroMQ holds of a connection's input: one message of endless
    # parts grows the broker's memory until it is killed. Only for clients you
    # trust (docs/operations.md, "The inbound watcher"). Default true.
    inbound_watcher: bool = True
    # Requests one ZeroMQ message from a client may carry (a part each: the
    # client library sends what one connection writes in a round as one
    # message); a message with more parts is refused whole with
    # INVALID_ARGUMENT. 64..65536 (a client may always send 64). Default 1024.
    requests_per_message_max: int = 1024
    # security.mode curve: admin-port CURVE keys whose Connect carried a token,
    # remembered with its principal (key -> principal, token expiry) for the
    # key's later admin requests; past it the oldest is forgotten (its client
    # connects again when refused). 1..2**31-1, default 4096.
    admin_principals_max: int = 4096
    # The same map's bytes (each entry: its key, principal name and token id,
    # plus 128); the oldest go first past it. At least 65536, default 4 MiB.
    admin_principals_bytes_max: int = 4 * MIB
    # A schema definition (register, check) longer than this is refused before it is
    # parsed. 1 KiB..1 MiB (the metadata store's value bound), default 256 KiB.
    schema_definition_bytes_max: int = 256 * KIB
    # JSON values (objects, arrays, strings, numbers, ...) in a JSON Schema or Avro
    # definition: the work of compiling it grows with them. 16..1,000,000, default 20,000.
    schema_nodes_max: int = 20_000
    # How deeply a JSON Schema or Avro definition nests (an Avro record in a record is
    # about 4 levels deeper). 8..1,000, default 64.
    schema_depth_max: int = 64
    # Time a topic spends validating one batch's payloads against their schema; past it
    # the batch is refused with INVALID_ARGUMENT (send smaller batches). 1..60,000 ms,
    # default 200.
    schema_validation_budget_ms: int = 200

    def __post_init__(self) -> None:
        _check_types(self)
        # A reliable topic writes a message as one WAL record, whose body a scan takes
        # for damage past RECORD_BODY_BYTES_MAX; the gRPC door and the admin client
        # take 64 MiB too.
        if not 1 <= self.frame_bytes_max <= RECORD_BODY_BYTES_MAX:
            raise _error("limits.frame_bytes_max", f"must be between 1 and {RECORD_BODY_BYTES_MAX} (64 MiB, the largest"
                         f" WAL record), got {self.frame_bytes_max}")
        for name in (
            "connections_max",
            "mailbox_messages_max",
            "producers_per_connection_max",
            "consumers_per_connection_max",
            "outbound_bytes_per_connection_max",
            "connections_pending_max",
        ):
            _check_range(f"limits.{name}", getattr(self, name), 1, _INT_MAX)
        _check_range(
            "limits.outbound_frames_max", self.outbound_frames_max, 1, _C_INT_MAX
        )
        _check_at_least("limits.mailbox_bytes_max", self.mailbox_bytes_max,
                        "limits.frame_bytes_max", self.frame_bytes_max,
                        "the largest frame (limits.frame_bytes_max)")
        _check_at_least("limits.outbound_bytes_max", self.outbound_bytes_max, "limits.outbound_bytes_per_connection_max",
                        self.outbound_bytes_per_connection_max,
                        "one connection's budget (limits.outbound_bytes_per_connection_max)")
        _check_range("limits.outbound_stall_timeout_ms", self.outbound_stall_timeout_ms, 100, 86_400_000)
        _check_range("limits.connect_timeout_ms", self.connect_timeout_ms, 100, 86_400_000)
        _check_at_least("limits.inbound_bytes_per_connection_max", self.inbound_bytes_per_connection_max,
                        "limits.frame_bytes_max", self.frame_bytes_max + 1,
                        "a frame and a byte (limits.frame_bytes_max + 1)")
        _check_at_least("limits.inbound_bytes_max", self.inbound_bytes_max, "limits.inbound_bytes_per_connection_max",
                        self.inbound_bytes_per_connection_max,
                        "one connection's budget (limits.inbound_bytes_per_connection_max)")
        _check_range("limits.requests_per_message_max", self.requests_per_message_max, 64, 65536)
        _check_range("limits.admin_principals_max", self.admin_principals_max, 1, _INT_MAX)
        _check_range("limits.admin_principals_bytes_max", self.admin_principals_bytes_max, 65536, _INT_MAX)
        _check_range("limits.schema_definition_bytes_max", self.schema_definition_bytes_max, KIB, MIB)
        _check_range("limits.schema_nodes_max", self.schema_nodes_max, 16, 1_000_000)
        _check_range("limits.schema_depth_max", self.schema_depth_max, 8, 1_000)
        _check_range("limits.schema_validation_budget_ms", self.schema_validation_budget_ms, 1, 60_000)


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchSection:
    """How subscriptions hold messages for their consumers."""

    SECTION: ClassVar[str] = "dispatch"

    # Non-reliable topics: messages one subscription holds for consumers that
    # have no permits left. Beyond this, new messages are dropped and counted
    # (subscription statistics `dropped_messages`). Default 10000.
    pending_messages_max: int = 10000
    # Non-reliable topics: bytes of message payload one subscription holds
    # the same way; whichever of the two bounds is reached first applies.
    # Default 16 MiB. At least policies.max_message_size: a subscription whose
    # consumers are paused (no permits, or their connection's outbound budget
    # half full) must be able to hold the largest message.
    pending_bytes_max: int = 16 * MIB
    # Receiver queue size (permits) a client is told to use when it does not
    # choose one. Only informational: the broker does not enforce it.
    # Default 1000.
    receiver_queue_size_default: int = 1000
    # Non-reliable topics: the most recent messages a topic keeps in memory so
    # that a new subscription with initial position `earliest` starts from them.
    # 0 keeps none (earliest is then the same as latest). Default 1000.
    tail_messages_max: int = 1000
    # The same tail bounded in bytes (each batch counted at the size of the Send frame it
    # came in: the same columns as the Publish kept). Default 1 MiB.
    tail_bytes_max: int = 1 * MIB

    def __post_init__(self) -> None:
        _check_types(self)
        for name in ("tail_messages_max", "tail_bytes_max"):
            _check_range(f"dispatch.{name}", getattr(self, name), 0, _INT_MAX)
        for name in (
            "pending_messages_max",
            "pending_bytes_max",
            "receiver_queue_size_default",
        ):
            _check_range(f"dispatch.{name}", getattr(self, name), 1, _INT_MAX)


BACKLOG_QUOTA_POLICIES = ("producer_exception", "producer_request_hold", "consumer_backlog_eviction")
# A subscriber-created topic's shape and dispatch (policies.allow_auto_topic_creation_type,
# auto_topic_creation_dispatch; Pulsar's spelling of the types).
AUTO_TOPIC_CREATION_TYPES = ("non-partitioned", "partitioned")
AUTO_TOPIC_CREATION_DISPATCHES = ("non_reliable", "reliable")
# The `policies` keys a namespace may override for its subscriber-created topics
# (`namespaces policies set`, actors/policy/policy_keeper.py).
AUTO_TOPIC_CREATION_POLICIES = (
    "allow_auto_topic_creation",
    "allow_auto_topic_creation_type",
    "default_num_partitions",
    "auto_topic_creation_dispatch",
)
# The `policies` keys a namespace or a topic may override (`namespaces|topics policies
# set`, actors/policy/policy_keeper.py); each 0 = unlimited but max_message_size.
TOPIC_POLICY_NAMES = (
    "max_producers_per_topic",
    "max_subscriptions_per_topic",
    "max_consumers_per_topic",
    "max_consumers_per_subscription",
    "max_message_size",
    "max_publish_rate",
    "max_dispatch_rate",
    # Retention of a reliable topic's sealed segments (0: kept), over `storage.retention_*`.
    "retention_time_ms",
    "retention_bytes_max",
    # Subscriptions without a consumer for this long are removed (0: never).
    "subscription_expiration_ms",
    # Reliable topics: messages older than this are acknowledged for every subscription
    # (0: never; Pulsar's message TTL).
    "message_ttl_s",
    # Reliable topics: a message whose producer sent its sequence id before is answered
    # with its first offset and not stored again (1: on, 0: off; Pulsar's deduplication).
    "deduplication",
    # Reliable topics: compacted once this many bytes were written since the last
    # compaction (0: never; Pulsar's compactionThreshold).
    "compaction_threshold_bytes",
)
# The topic policies whose 0 means never (for the others 0 is unlimited; retention: kept).
ZERO_IS_NEVER = ("subscription_expiration_ms", "message_ttl_s", "compaction_threshold_bytes")
# The topic policies that are on (1) or off (0).
BOOLEAN_POLICIES = ("deduplication",)
_RETENTION_POLICIES = ("retention_time_ms", "retention_bytes_max")


def topic_policy_default(config: BrokerConfig, name: str) -> int:
    """The broker's value of topic policy `name`, where neither the topic nor its
    namespace sets one. Retention comes from `storage` (null there: kept, 0 here; a
    configured 0 ms or 0 bytes keeps nothing past the cursors, as 1 does)."""
    if name in _RETENTION_POLICIES:
        value = getattr(config.storage, name)
        return 0 if value is None else max(value, 1)
    return int(getattr(config.policies, name))


@dataclass(frozen=True, slots=True, kw_only=True)
class PoliciesSection:
    """Broker-wide default topic policies. A namespace or a topic may set its own
    TOPIC_POLICY_NAMES (actors/policy/policies.py); these apply where none is set.

    The names are Danube's (`max_*` first, against our `*_max` habit), kept on
    purpose so that a Danube `policies:` section reads the same here.
    """

    SECTION: ClassVar[str] = "policies"

    # Producers on one topic at once; 0 = unlimited. Default 0.
    max_producers_per_topic: int = 0
    # Subscriptions on one topic; 0 = unlimited. Default 1000: each subscription with a
    # consumer may hold dispatch.pending_bytes_max (16 MiB) of non-reliable messages, so
    # this bounds a topic's pending memory (those without consumers hold none).
    max_subscriptions_per_topic: int = 1000
    # Consumers on one topic, over all its subscriptions; 0 = unlimited. Default 0.
    max_consumers_per_topic: int = 0
    # Consumers on one subscription; 0 = unlimited. Default 0.
    max_consumers_per_subscription: int = 0
    # Largest message payload accepted from a producer, in bytes; at least 1
    # (no "unlimited": a frame has a size). Default 10485760 (10 MiB).
    # Must be less than limits.frame_bytes_max - 1 MiB, and at most
    # dispatch.pending_bytes_max.
    max_message_size: int = 10 * MIB
    # Messages per second one topic (each partition) accepts from all its producers
    # together; 0 = unlimited. Past it the topic delays its answers to the producers'
    # batches (a producer's window of batches in flight then slows it): never a drop
    # or an error (Danube only warns). Default 0.
    max_publish_rate: int = 0
    # Bytes of batches one topic holds back over max_publish_rate. The producers'
    # windows of batches in flight keep it far below this; a client ignoring its window
    # meets RESOURCE_EXHAUSTED (retriable) past it. Default 67108864 (64 MiB).
    publish_rate_hold_bytes_max: int = 64 * MIB
    # Messages per second one subscription delivers to all its consumers together;
    # 0 = unlimited. Past it deliveries wait for the next second's allowance. Default 0.
    max_dispatch_rate: int = 0
    # Backlog quota of a reliable topic (Pulsar's backlog quota `limitSize`): bytes
    # its slowest subscription has not acknowledged (cursor to the end of the log,
    # WAL record headers included); 0 = unlimited. What happens past it is
    # backlog_quota_policy. A topic without subscriptions has no backlog: retention
    # decides. Default 10737418240 (10 GiB): a consumer stopped for a few minutes at
    # full speed on one topic, far below a typical data disk, so one stuck consumer
    # cannot fill the disk its topic shares with every other topic.
    backlog_quota_bytes_max: int = 10 * 1024 * MIB
    # What a send meets once the backlog is over backlog_quota_bytes_max, Pulsar's
    # policies: producer_exception (refused at once with RESOURCE_EXHAUSTED naming
    # topic, backlog and quota; retriable), producer_request_hold (held unanswered
    # until acks bring the backlog under the quota, at most backlog_quota_hold_ms_max),
    # consumer_backlog_eviction (accepted; the slowest subscriptions' cursors are moved
    # past their oldest messages until the backlog is 90% of the quota: those messages
    # are lost to them, counted as evicted in `topics describe`). Default
    # producer_exception: producers learn at once, and nothing is dropped without a
    # consumer having asked for it.
    backlog_quota_policy: str = "producer_exception"
    # producer_request_hold: the longest a send is held before it is refused with
    # RESOURCE_EXHAUSTED (retriable). Keep it below the clients' request timeout
    # (10 s by default). Default 5000 ms.
    backlog_quota_hold_ms_max: int = 5000
    # producer_request_hold: bytes of sends held per topic; a send past it is refused
    # at once. Default 67108864 (64 MiB).
    backlog_quota_hold_bytes_max: int = 64 * MIB
    # The two below are ours (Danube has none), named by our `*_max` habit.
    # Partitions one partitioned topic may have; creating one with more (client
    # GetPartitions/producer, admin create) is refused with INVALID_ARGUMENT
    # naming this key. 1..100000. Default 1000. A namespace's own limit
    # (`namespaces set-limits`, actors/policy/policy_keeper.py) overrides it.
    partitions_per_topic_max: int = 1000
    # Topics one namespace may hold, each partition counted as one topic (as
    # Pulsar's maxTopicsPerNamespace); a create past it is refused with
    # RESOURCE_EXHAUSTED naming this key. Checked on the broker's applied state:
    # creates racing on several brokers may pass it by the ones in flight.
    # 1..1000000 (the metadata store holds at most 1,000,000 keys). Default 10000.
    # A namespace's own limit (`namespaces set-limits`) overrides it.
    topics_per_namespace_max: int = 10_000
    # A subscription with no consumer attached for this long is removed with its
    # cursor (Pulsar's subscriptionExpirationTimeMinutes), freeing the log it held back
    # and its place under max_subscriptions_per_topic; a namespace or topic may set its
    # own (0: never, Pulsar's default). Idle counts from its last consumer leaving, or
    # from the broker loading its topic (a restart starts the count again).
    # Default 604800000 (7 days): a subscription nobody attached to for a week is
    # abandoned by any reasonable measure, while a consumer down over a long weekend
    # keeps its place; set more for consumers that come back less often (a weekly
    # job: 14 days). Anyone who may consume can make subscriptions, and each one left
    # behind holds a reliable topic's log up to the backlog quota.
    subscription_expiration_ms: int = 7 * 24 * 3_600_000
    # Message TTL (Pulsar's ttlDurationDefaultInSeconds), reliable topics: a message
    # published longer ago than this many seconds is acknowledged for every
    # subscription, as if consumed (danube_subscription_messages_expired_total). A
    # namespace or topic may set its own. Default 0: never, as in Pulsar.
    message_ttl_s: int = 0
    # How often a reliable topic with a message TTL looks for messages past it (Pulsar's
    # messageExpiryCheckIntervalInMinutes, 5 min there): an expired message is
    # acknowledged at most this long after its time. 10..3600000. Default 1000.
    message_expiry_check_interval_ms: int = 1000
    # Producer deduplication (Pulsar's brokerDeduplicationEnabled), reliable topics: a
    # message whose producer name and sequence id the topic stored before is answered
    # with its first offset and not stored again. A namespace or topic may set its own
    # (danube admin namespaces|topics policies set --deduplication true). Default false.
    deduplication: bool = False
    # Automatic topic compaction (Pulsar's compactionThreshold), reliable topics: a
    # topic is compacted once its log holds this many bytes past the last compaction's
    # horizon, looked at every storage.retention_check_interval_ms. A namespace or
    # topic may set its own. Default 0: never (compact with danube admin topics compact).
    compaction_threshold_bytes: int = 0
    # A producer name not attached and silent for this long is forgotten by the topic's
    # deduplication table (Pulsar's brokerDeduplicationProducerInactivityTimeoutMinutes,
    # 6 hours there and here). 1..31536000 s.
    deduplication_producer_inactivity_s: int = 21_600
    # Per producer name, the last messages whose offsets a duplicate is answered with
    # (older duplicates get -1, as every duplicate in Pulsar). Past a kill -9 a client
    # sends again what it had in flight: the default covers 10 batches of 1,000. Kept as
    # runs of consecutive ids (about 150 bytes each; consecutive batches of one producer
    # merge into one), so the bound is a run per message only for single-message
    # batches interleaved with other producers'. 1..1000000.
    deduplication_window: int = 10_000
    # Producer names one topic's table keeps; past it the least recently active is
    # forgotten (logged). With the window, the table's bound: producers_max * window
    # runs at worst (150 MB), a few hundred bytes per producer as batches come. 1..1000000.
    deduplication_producers_max: int = 100
    # Pulsar's allowAutoTopicCreation, for subscribers: a consumer subscribing to a
    # topic that does not exist creates it (its principal needs Produce on it, as a
    # producer's create does) instead of meeting NOT_FOUND; false: Danube's behaviour,
    # only producers and admins create topics. A namespace may set its own
    # (danube admin namespaces policies set); broker.auto_create_topics false turns
    # off every client's creation whatever this says. Default true.
    allow_auto_topic_creation: bool = True
    # The shape of a topic a subscriber creates (Pulsar's allowAutoTopicCreationType):
    # non-partitioned, or partitioned with default_num_partitions partitions. A
    # producer names its own shape. Default non-partitioned.
    allow_auto_topic_creation_type: str = "non-partitioned"
    # Partitions of a partitioned topic a subscriber creates (Pulsar's
    # defaultNumPartitions); 1..partitions_per_topic_max. Default 1.
    default_num_partitions: int = 1
    # The dispatch strategy of a topic a subscriber creates, until a producer attaches:
    # the first producer's strategy replaces it (the topic restarts with its
    # subscriptions). non_reliable or reliable. Default non_reliable.
    auto_topic_creation_dispatch: str = "non_reliable"

    def __post_init__(self) -> None:
        _check_types(self)
        if self.allow_auto_topic_creation_type not in AUTO_TOPIC_CREATION_TYPES:
            raise _error("policies.allow_auto_topic_creation_type",
                         f"must be one of {', '.join(AUTO_TOPIC_CREATION_TYPES)},"
                         f" got {self.allow_auto_topic_creation_type!r}")
        if self.auto_topic_creation_dispatch not in AUTO_TOPIC_CREATION_DISPATCHES:
            raise _error("policies.auto_topic_creation_dispatch",
                         f"must be one of {', '.join(AUTO_TOPIC_CREATION_DISPATCHES)},"
                         f" got {self.auto_topic_creation_dispatch!r}")
        _check_range("policies.default_num_partitions", self.default_num_partitions, 1,
                     self.partitions_per_topic_max)
        if self.backlog_quota_policy not in BACKLOG_QUOTA_POLICIES:
            raise _error("policies.backlog_quota_policy",
                         f"must be one of {', '.join(BACKLOG_QUOTA_POLICIES)}, got {self.backlog_quota_policy!r}")
        _check_range("policies.backlog_quota_hold_ms_max", self.backlog_quota_hold_ms_max, 1, 3_600_000)
        for name in ("backlog_quota_bytes_max", "backlog_quota_hold_bytes_max", "publish_rate_hold_bytes_max"):
            _check_range(f"policies.{name}", getattr(self, name), 0, _INT_MAX)
        _check_range("policies.partitions_per_topic_max", self.partitions_per_topic_max, 1, 100_000)
        _check_range("policies.topics_per_namespace_max", self.topics_per_namespace_max, 1, 1_000_000)
        for name in (
            "max_producers_per_topic",
            "max_subscriptions_per_topic",
            "max_consumers_per_topic",
            "max_consumers_per_subscription",
            "max_publish_rate",
            "max_dispatch_rate",
            "subscription_expiration_ms",
            "message_ttl_s",
            "compaction_threshold_bytes",
        ):
            _check_range(f"policies.{name}", getattr(self, name), 0, _INT_MAX)
        _check_range("policies.message_expiry_check_interval_ms", self.message_expiry_check_interval_ms, 10,
                     3_600_000)
        _check_range("policies.deduplication_producer_inactivity_s", self.deduplication_producer_inactivity_s, 1,
                     31_536_000)
        _check_range("policies.deduplication_window", self.deduplication_window, 1, 1_000_000)
        _check_range("policies.deduplication_producers_max", self.deduplication_producers_max, 1, 1_000_000)
        _check_range("policies.max_message_size", self.max_message_size, 1, _INT_MAX)


_WAL_SYNC_MODES = ("always", "interval")
_STORAGE_MODES = ("local", "shared_fs", "object_store")
_POISON_POLICIES = ("block", "drop", "dead_letter")
_BACKOFFS = ("fixed", "exponential")


@dataclass(frozen=True, slots=True, kw_only=True)
class StorageSection:
    """Where reliable topics keep their messages (Danube's `storage:` section)."""

    SECTION: ClassVar[str] = "storage"

    # local: WAL and sealed segments on this broker's disk (under broker.data_dir);
    # shared_fs: local WAL, sealed segments copied to durable_url (a mounted path);
    # object_store: local WAL, sealed segments uploaded to durable_url
    # (s3://, gs://, az://, abfs://, memory://). Default local.
    mode: str = "local"
    # Where durable segments go in shared_fs and object_store modes; unused in
    # local mode. Default None (required by those modes).
    durable_url: str | None = None
    # always: a producer's send is acknowledged only after its WAL records are
    # fsynced (group commit: one fsync covers every batch that arrived meanwhile).
    # interval: acknowledge after the write and fsync every wal_sync_interval_ms,
    # Danube's faster, weaker mode: a broker crash (kill -9 is enough only if the OS
    # also fails; a power loss certainly) can lose acknowledged messages. Default always.
    wal_sync: str = "always"
    # interval mode: the longest time written records wait for their fsync, ms (plus
    # at most one flush, under any load). Default 1000.
    wal_sync_interval_ms: int = 1000
    # A WAL segment file is sealed and a new one started past this size, bytes.
    # Default 64 MiB.
    wal_segment_bytes_max: int = 64 * MIB
    # ... or past this age, ms; null: no age limit. Default null.
    wal_segment_age_ms_max: int | None = None
    # shared_fs / object_store: seal the WAL segment after every group commit and answer
    # its receipts only once it is in the durable store (uploaded, its descriptor
    # committed by a Raft majority): nothing acknowledged lives only on this broker's
    # disk, so neither a dead disk nor an owner cut off from the majority loses an
    # acknowledged message. Costs a segment file, an upload and a metadata write per
    # flush, and their latency per receipt. Default false.
    seal_every_flush: bool = False
    # seal_every_flush: receipts a topic holds while its segments upload; past it, sends
    # are refused RESOURCE_EXHAUSTED (retriable) until uploads catch up. Default 10,000.
    receipts_held_max: int = 10_000
    # shared_fs / object_store: reliable cursors are checkpoints in the topic's WAL (as
    # in local mode) and reach the next broker in the sealed, uploaded segments and in
    # the published checkpoints-only segment ({base}.cursors: one PUT per checkpoint
    # flush with no message), instead of metadata-store writes every
    # cursor_flush_interval_ms. A move carries every cursor, and so does a failover with
    # seal_every_flush; without it a failover goes back to the newest uploaded segment's
    # cursors (redelivery). Off until its costs are measured (docs/scaling.md). Default false.
    cursors_in_segments: bool = False
    # Recent committed batches a reliable topic keeps in memory to serve readers
    # without touching the WAL files, bytes. Default 16 MiB.
    cache_bytes_max: int = 16 * MIB
    # How often the broker's cursor flusher writes subscription cursors to the metadata
    # store (a crash redelivers at most the acknowledgements of this window; a clean
    # stop writes them all), ms. Default 100.
    cursor_flush_interval_ms: int = 100
    # Topic retention: sealed segments older than this (ms since their last record was
    # written) are deleted once every subscription's cursor has passed them; null keeps
    # them. Default null.
    retention_time_ms: int | None = None
    # ... and the oldest sealed segments go while a topic holds more than this many
    # bytes (same cursor rule); null: no size limit. Default null.
    retention_bytes_max: int | None = None
    # shared_fs and object_store: a local WAL file is deleted once a durable segment
    # covers it and it is older than this (ms) or the topic's local WAL exceeds
    # local_retention_bytes_max. Default 3600000 (1 hour).
    local_retention_ms: int = 3_600_000
    # Default 1 GiB.
    local_retention_bytes_max: int = 1024 * MIB
    # How often retention runs, ms. Default 60000.
    retention_check_interval_ms: int = 60_000
    # Sealed segments uploaded at once by a broker (shared_fs, object_store). Default 4.
    uploads_max: int = 4
    # Reliable sends are refused with RESOURCE_EXHAUSTED while the filesystem of the
    # WAL has less free space than this (bytes available to the broker's user), so the
    # disk never fills under the WAL (nor under the metadata store beside it); 0 turns
    # the check off. Default 1073741824 (1 GiB).
    disk_free_bytes_min: int = 1024 * MIB
    # How often a reliable topic that takes sends measures that free space (one statvfs
    # per topic per interval, never one per send), ms. Default 1000.
    disk_check_interval_ms: int = 1000
    # Distinct keys one compaction of a topic holds in memory (a key and an offset each,
    # about 100 bytes); past it the compaction fails and says so. Default 1000000.
    compaction_keys_max: int = 1_000_000

    def __post_init__(self) -> None:
        _check_types(self)
        _check_range("storage.disk_free_bytes_min", self.disk_free_bytes_min, 0, _INT_MAX)
        _check_range("storage.compaction_keys_max", self.compaction_keys_max, 1, 100_000_000)
        _check_range("storage.disk_check_interval_ms", self.disk_check_interval_ms, 10, 3_600_000)
        if self.mode not in _STORAGE_MODES:
            raise _error("storage.mode", f"must be one of {', '.join(_STORAGE_MODES)}, got {self.mode!r}")
        if self.mode != "local" and not self.durable_url:
            raise _error("storage.durable_url", f"is required when storage.mode is {self.mode}", "storage.mode")
        if self.wal_sync not in _WAL_SYNC_MODES:
            raise _error("storage.wal_sync", f"must be always or interval, got {self.wal_sync!r}")
        _check_range("storage.wal_sync_interval_ms", self.wal_sync_interval_ms, 1, 3_600_000)
        _check_range("storage.wal_segment_bytes_max", self.wal_segment_bytes_max, 4096, _INT_MAX)
        _check_range("storage.receipts_held_max", self.receipts_held_max, 1, 10_000_000)
        if self.wal_segment_age_ms_max is not None:
            _check_range("storage.wal_segment_age_ms_max", self.wal_segment_age_ms_max, 1000, _INT_MAX)
        _check_range("storage.cache_bytes_max", self.cache_bytes_max, 0, _INT_MAX)
        _check_range("storage.cursor_flush_interval_ms", self.cursor_flush_interval_ms, 1, 60_000)
        if self.retention_time_ms is not None:
            _check_range("storage.retention_time_ms", self.retention_time_ms, 0, _INT_MAX)
        if self.retention_bytes_max is not None:
            _check_range("storage.retention_bytes_max", self.retention_bytes_max, 0, _INT_MAX)
        _check_range("storage.local_retention_ms", self.local_retention_ms, 0, _INT_MAX)
        _check_range("storage.local_retention_bytes_max", self.local_retention_bytes_max, 0, _INT_MAX)
        _check_range("storage.retention_check_interval_ms", self.retention_check_interval_ms, 10, 86_400_000)
        _check_range("storage.uploads_max", self.uploads_max, 1, 64)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReliableSection:
    """Delivery on reliable topics: windows, redelivery and the poison policy
    (Danube's dispatch config and subscription failure policy defaults)."""

    SECTION: ClassVar[str] = "reliable"

    # Messages delivered to one consumer and not yet acknowledged; delivery to it
    # pauses at this many. Default 1000.
    max_unacked_messages: int = 1000
    # A delivered message not acknowledged within this time is redelivered, ms.
    # Default 30000.
    ack_timeout_ms: int = 30_000
    # Redeliveries of one message before the poison policy applies. Default 5.
    max_redelivery_count: int = 5
    # Delay before the first redelivery after a nack or timeout, ms. Default 1000.
    base_redelivery_delay_ms: int = 1000
    # Longest redelivery delay (exponential backoff stops growing here), ms;
    # at least base_redelivery_delay_ms. Default 60000.
    max_redelivery_delay_ms: int = 60_000
    # fixed: every redelivery waits base_redelivery_delay_ms; exponential: base x 2^(n-1).
    backoff: str = "exponential"
    # What happens to a message redelivered max_redelivery_count times: block
    # (the subscription stops at it), drop (skip it) or dead_letter (republish it to
    # dead_letter_topic, then skip it). Default block.
    poison_policy: str = "block"
    # Topic that dead-lettered messages go to; required for dead_letter.
    dead_letter_topic: str | None = None
    # Delayed messages (deliver_after_ms / deliver_at_ms) a Shared or Key-Shared
    # subscription holds before it stops reading on, until some are due: 16 bytes each
    # in sorted runs under the topic's durable-cache/delayed/ (rebuilt from the log at
    # every start). Default 20,000,000 (about 320 MB of disk).
    delayed_messages_max: int = 20_000_000
    # Of those, the newest held in memory before they are sorted into a run on disk
    # (about 100 bytes each); each run keeps its 1,024 soonest in memory. Default 65,536.
    delayed_memory_entries: int = 65_536

    def __post_init__(self) -> None:
        _check_types(self)
        _check_range("reliable.max_unacked_messages", self.max_unacked_messages, 1, 10_000)
        _check_range("reliable.delayed_messages_max", self.delayed_messages_max, 1, 1_000_000_000)
        _check_range("reliable.delayed_memory_entries", self.delayed_memory_entries, 1, 10_000_000)
        _check_range("reliable.ack_timeout_ms", self.ack_timeout_ms, 10, 86_400_000)
        _check_range("reliable.max_redelivery_count", self.max_redelivery_count, 0, 1000)
        _check_range("reliable.base_redelivery_delay_ms", self.base_redelivery_delay_ms, 0, 86_400_000)
        _check_range("reliable.max_redelivery_delay_ms", self.max_redelivery_delay_ms, self.base_redelivery_delay_ms,
                     86_400_000)
        if self.backoff not in _BACKOFFS:
            raise _error("reliable.backoff", f"must be fixed or exponential, got {self.backoff!r}")
        if self.poison_policy not in _POISON_POLICIES:
            raise _error("reliable.poison_policy", f"must be one of {', '.join(_POISON_POLICIES)}, got {self.poison_policy!r}")
        if self.poison_policy == "dead_letter" and not self.dead_letter_topic:
            raise _error("reliable.dead_letter_topic", "is required when reliable.poison_policy is dead_letter",
                         "reliable.poison_policy")
        if self.dead_letter_topic is not None:
            # Checked here: a bad name found only when the first letter is written loses it.
            try:
                parse_topic(self.dead_letter_topic)
            except InvalidArgument as exc:
                raise _error("reliable.dead_letter_topic", str(exc)) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSection:
    """The broker's Raft peer of the metadata store (`danube admin cluster ...`)."""

    SECTION: ClassVar[str] = "cluster"

    # This broker's Raft node id, 1..2**63-1, unique in the cluster; it is written
    # into broker.data_dir/metadata on first start and a different id later is an
    # error. Default 1.
    node_id: int = 1
    # Where the Raft peer listens for the other peers (tcp://HOST:PORT). Default
    # null: standalone, a single-voter Raft with no socket.
    raft_listen: str | None = None
    # The address the other peers use to reach this one, if not raft_listen.
    raft_advertised: str | None = None
    # The founding voters, each "ID=tcp://HOST:PORT", this node included. Every
    # founder lists the same set; it is used once, when the cluster first forms.
    # Default [] (standalone, or a node that joins).
    peers: tuple[str, ...] = ()
    # Start with an empty log and wait to be added (`danube admin cluster add-node`,
    # then `promote-node`) instead of founding a cluster; `peers` then lists
    # members to reach. Default false.
    join: bool = False
    # The Raft timer period, ms. Default 50.
    tick_ms: int = 50
    # Leader heartbeat period, ms; a multiple of tick_ms. Default 100.
    heartbeat_interval_ms: int = 100
    # A follower that hears nothing from a leader for a random time in
    # [min, max) ms starts an election. Default 500 and 1000: a new leader within
    # about a second of a leader crash.
    election_timeout_ms_min: int = 500
    election_timeout_ms_max: int = 1000
    # Snapshot the metadata and compact the log past this many entries. Default 10000.
    snapshot_entries: int = 10_000
    # A metadata write or read not answered in this time fails with TIMEOUT, ms.
    # Default 5000.
    request_timeout_ms: int = 5000
    # The broker's registration lease, ms: renewed every third of it. A broker that
    # cannot renew stops serving its topics before the lease runs out, and the load
    # manager gives them to other brokers once it has. Default 6000.
    lease_ttl_ms: int = 6000
    # In storage.mode local a reliable topic's WAL lives on its broker's disk only: a
    # move (`topics unload`) hands the segments its subscriptions still need to the
    # next broker over the admin port before ownership switches, or is refused. The
    # most bytes one move may hand over (both ends check it). Default 1 GiB.
    move_bytes_max: int = 1024 * MIB
    # The bytes of one chunk of a move (each carries a CRC32C); at most
    # limits.frame_bytes_max less 64 KiB, the frame's envelope. Default 1 MiB.
    move_chunk_bytes_max: int = MIB
    # A move that has not handed everything over within this time is refused and the
    # topic stays where it was, ms. Default 60000.
    move_timeout_ms: int = 60_000

    def __post_init__(self) -> None:
        if isinstance(self.peers, list):
            object.__setattr__(self, "peers", tuple(self.peers))
        _check_types(self)
        _check_range("cluster.node_id", self.node_id, 1, _INT_MAX)
        for key in ("raft_listen", "raft_advertised"):
            endpoint = getattr(self, key)
            if endpoint is not None:
                _check_endpoint(f"cluster.{key}", endpoint)
                if not endpoint.startswith("tcp://"):
                    raise _error(f"cluster.{key}", f"raft peers talk over tcp://, got {endpoint!r}")
        _check_range("cluster.tick_ms", self.tick_ms, 1, 10_000)
        _check_range("cluster.heartbeat_interval_ms", self.heartbeat_interval_ms, self.tick_ms, 60_000)
        _check_range("cluster.election_timeout_ms_min", self.election_timeout_ms_min,
                     self.heartbeat_interval_ms + self.tick_ms, 600_000)
        _check_range("cluster.election_timeout_ms_max", self.election_timeout_ms_max,
                     self.election_timeout_ms_min + self.tick_ms, 600_000)
        _check_range("cluster.snapshot_entries", self.snapshot_entries, 10, _INT_MAX)
        _check_range("cluster.request_timeout_ms", self.request_timeout_ms, 10, 3_600_000)
        _check_range("cluster.lease_ttl_ms", self.lease_ttl_ms, 300, 3_600_000)
        _check_range("cluster.move_bytes_max", self.move_bytes_max, 0, _INT_MAX)
        _check_range("cluster.move_chunk_bytes_max", self.move_chunk_bytes_max, 4096, 64 * MIB)
        _check_range("cluster.move_timeout_ms", self.move_timeout_ms, 10, 3_600_000)
        founders = self.peer_addresses()
        if founders and self.raft_listen is None:
            raise _error("cluster.raft_listen", "is required when cluster.peers is set", "cluster.peers")
        if self.join and self.raft_listen is None:
            raise _error("cluster.raft_listen", "is required when cluster.join is true", "cluster.join")
        if founders and not self.join and self.node_id not in founders:
            raise _error("cluster.peers", f"founding voters must include this node (cluster.node_id {self.node_id})",
                         "cluster.node_id")

    def peer_addresses(self) -> dict[int, str]:
        """`peers` as {node id: address}; the checks name the bad entry."""
        out: dict[int, str] = {}
        for item in self.peers:
            node, eq, address = item.partition("=")
            if not (eq and node.strip().isdigit() and int(node) >= 1):
                raise _error("cluster.peers", f"each entry is ID=tcp://HOST:PORT with ID >= 1, got {item!r}")
            _check_endpoint("cluster.peers", address.strip())
            if int(node) in out:
                raise _error("cluster.peers", f"node {int(node)} is listed twice")
            out[int(node)] = address.strip()
        return out

    @property
    def ticks(self) -> tuple[int, int, int]:
        """(heartbeat, election min, election max) in ticks."""
        return (
            max(1, self.heartbeat_interval_ms // self.tick_ms),
            max(2, self.election_timeout_ms_min // self.tick_ms),
            max(3, self.election_timeout_ms_max // self.tick_ms),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadManagerSection:
    """Where the cluster's leader puts topics (`actors/load/`)."""

    SECTION: ClassVar[str] = "load_manager"

    # fair (fewest topics), balanced (topic load, CPU and memory) or weighted_load
    # (the same plus throughput, the bottleneck weighing most). Default balanced.
    assignment_strategy: str = "balanced"
    # How often each broker publishes its load report (CPU, memory, per-topic rates),
    # ms. Default 30000, as Danube's load_report_interval_seconds: a report asks every
    # topic for its counters (with 1,000 topics, every 5 s cost an idle broker ~4% of a core).
    report_interval_ms: int = 30_000
    # Move topics from the most to the least loaded broker while the coefficient of
    # variation of broker load is above the level's threshold. Default false.
    rebalancing: bool = False
    # conservative (CV 0.40, checked every 600 s, 5 moves an hour, 120 s cooldown),
    # balanced (0.30, 300 s, 10, 60 s) or aggressive (0.20, 180 s, 20, 30 s).
    rebalancing_level: str = "balanced"
    # Overrides of the level's values; null keeps the level's.
    rebalancing_check_interval_s: int | None = None
    rebalancing_max_moves_per_hour: int | None = None
    rebalancing_cooldown_s: int | None = None
    # A topic younger than this is not moved. Default 300.
    rebalancing_min_topic_age_s: int = 300
    # Topics never moved: exact names (/ns/topic) or whole namespaces (/ns/*).
    rebalancing_blacklist: tuple[str, ...] = ()
    # `brokers balance` flags a broker OVERLOADED when its load is above the cluster's
    # mean + one standard deviation and at least this. A topic's load is 0.2, plus 0.3
    # per MiB/s in and out, 0.3 per producer or consumer and 0.2 per 10,000 messages of
    # backlog. Default 10.0 (50 idle topics, or about 30 MiB/s).
    overload_threshold: float = 10.0

    def __post_init__(self) -> None:
        if isinstance(self.rebalancing_blacklist, list):
            object.__setattr__(self, "rebalancing_blacklist", tuple(self.rebalancing_blacklist))
        _check_types(self)
        object.__setattr__(self, "overload_threshold", float(self.overload_threshold))
        if not 0.0 <= self.overload_threshold <= 1e9:
            raise _error("load_manager.overload_threshold", f"must be in 0..1e9, got {self.overload_threshold}")
        if self.assignment_strategy not in ASSIGNMENT_STRATEGIES:
            raise _error("load_manager.assignment_strategy",
                         f"must be one of {', '.join(ASSIGNMENT_STRATEGIES)}, got {self.assignment_strategy!r}")
        if self.rebalancing_level not in REBALANCING_LEVELS:
            raise _error("load_manager.rebalancing_level",
                         f"must be one of {', '.join(REBALANCING_LEVELS)}, got {self.rebalancing_level!r}")
        _check_range("load_manager.report_interval_ms", self.report_interval_ms, 100, 3_600_000)
        for key in ("rebalancing_check_interval_s", "rebalancing_max_moves_per_hour"):
            if getattr(self, key) is not None:
                _check_range(f"load_manager.{key}", getattr(self, key), 1, 1_000_000)
        if self.rebalancing_cooldown_s is not None:
            _check_range("load_manager.rebalancing_cooldown_s", self.rebalancing_cooldown_s, 0, 1_000_000)
        _check_range("load_manager.rebalancing_min_topic_age_s", self.rebalancing_min_topic_age_s, 0, 1_000_000)
        for pattern in self.rebalancing_blacklist:
            if not pattern.startswith("/"):
                raise _error("load_manager.rebalancing_blacklist",
                             f"each entry is /namespace/topic or /namespace/*, got {pattern!r}")


ASSIGNMENT_STRATEGIES = ("fair", "balanced", "weighted_load")
REBALANCING_LEVELS = ("conservative", "balanced", "aggressive")


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotsSection:
    """WAL snapshots of reliable topics for Spark reports (`danube admin snapshots ...`,
    `danube report backlog`)."""

    SECTION: ClassVar[str] = "snapshots"

    # Where snapshots go: an fsspec URL (a path, file://, s3://, gs://, az://,
    # memory://). Default null: broker.data_dir/snapshots.
    url: str | None = None
    # Take a snapshot of every reliable topic this often, seconds; 0: only on demand
    # (`danube admin snapshots create`). Default 0.
    interval_seconds: int = 0
    # Keep this many snapshots (the oldest are deleted after each new one); 0: keep
    # all. Default 48.
    retention_count: int = 48
    # Export message payloads too (the data source's `payload` column); without them
    # snapshots hold everything but the payload bytes. Default false.
    include_payloads: bool = False
    # How long a topic keeps the files of a snapshot in progress from retention, ms.
    # Default 600000 (10 minutes).
    pin_ms: int = 600_000

    def __post_init__(self) -> None:
        _check_types(self)
        if self.url is not None and not self.url.strip():
            raise _error("snapshots.url", "must not be empty (null: broker.data_dir/snapshots)")
        _check_range("snapshots.interval_seconds", self.interval_seconds, 0, 365 * 86_400)
        _check_range("snapshots.retention_count", self.retention_count, 0, 1_000_000)
        _check_range("snapshots.pin_ms", self.pin_ms, 1000, 86_400_000)


SECURITY_MODES = ("none", "curve")
JWT_ALGORITHMS = ("HS256", "RS256", "EdDSA")


@dataclass(frozen=True, slots=True, kw_only=True)
class SecuritySection:
    """Who may reach this broker and what they may do (`docs/security.md`)."""

    SECTION: ClassVar[str] = "security"

    # "none": no encryption, no authentication, every request allowed; for a
    # standalone broker on loopback. "curve": CurveZMQ on every socket (client,
    # admin, Raft, broker to broker), JWT tokens and RBAC. Default none.
    mode: str = "none"
    # This broker's CURVE key pair: the secret key file as `danube security keys
    # generate` (zmq.auth.create_certificates) writes it. Required with curve.
    broker_key_file: str | None = None
    # Directory of the cluster's broker public key files (*.key): only these keys
    # may speak Raft and broker to broker, as `broker` principals. Required with curve.
    broker_public_keys_dir: str | None = None
    # How tokens are signed: HS256 (a shared secret), RS256 or EdDSA (a key
    # pair; brokers hold only the public key). Default HS256.
    jwt_algorithm: str = "HS256"
    # HS256: file holding the shared secret (at least 32 bytes). Default null.
    jwt_secret_file: str | None = None
    # RS256 / EdDSA: PEM file of the public key that checks tokens. Default null.
    jwt_public_key_file: str | None = None
    # Every token must name this issuer (`iss`) and this audience (`aud`).
    jwt_issuer: str = "danube"
    jwt_audience: str = "danube"
    # Clock skew allowed when checking `exp`, `iat` and `nbf`, ms. Default 30000.
    jwt_leeway_ms: int = 30_000
    # Subjects (`sub` of a token or a key principal's name) that hold every
    # permission everywhere. Default [].
    super_admins: tuple[str, ...] = ()
    # Longest token accepted in a Connect, bytes; a longer one is refused unread.
    # 256..65536, default 8192 (a token is a few hundred bytes).
    jwt_token_bytes_max: int = 8192
    # PEM certificate (chain) and private key of the metrics endpoint: with both set
    # it serves HTTPS only (TLS 1.2+). Default null: plain HTTP.
    metrics_tls_cert_file: str | None = None
    metrics_tls_key_file: str | None = None
    # Password file of the metrics endpoint's HTTP basic auth, one
    # `user:pbkdf2_sha256$<iterations>$<salt>$<hash>` line per user (`danube security
    # metrics password`); requests without a listed user and password get 401.
    # Default null: no authentication.
    metrics_basic_auth_file: str | None = None
    # PEM certificate (chain) and private key of the gRPC doors (broker.grpc_listen,
    # broker.grpc_admin_listen): with both set they serve TLS only. Required for the
    # doors with security.mode curve, whose callers send their token in every call.
    # Default null: plaintext gRPC.
    grpc_tls_cert_file: str | None = None
    grpc_tls_key_file: str | None = None
    # PEM file of the certificate authorities that sign the doors' clients: when set,
    # both doors require mutual TLS, a client certificate that one of them signed (a
    # client without one fails the handshake). It admits a connection only; the
    # bearer token stays the caller's identity for RBAC. Needs grpc_tls_cert_file and
    # grpc_tls_key_file; read when the doors start. Default null: server TLS only.
    grpc_tls_client_ca_file: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.super_admins, list):
            object.__setattr__(self, "super_admins", tuple(self.super_admins))
        _check_types(self)
        if self.mode not in SECURITY_MODES:
            raise _error("security.mode", f"must be one of {', '.join(SECURITY_MODES)}, got {self.mode!r}")
        if self.jwt_algorithm not in JWT_ALGORITHMS:
            raise _error("security.jwt_algorithm",
                         f"must be one of {', '.join(JWT_ALGORITHMS)}, got {self.jwt_algorithm!r}")
        _check_range("security.jwt_leeway_ms", self.jwt_leeway_ms, 0, 3_600_000)
        for key in ("jwt_issuer", "jwt_audience"):
            if not getattr(self, key):
                raise _error(f"security.{key}", "must not be empty")
        if self.mode == "curve":
            for key in ("broker_key_file", "broker_public_keys_dir"):
                if not getattr(self, key):
                    raise _error(f"security.{key}", "is required with security.mode curve", "security.mode")
        if self.jwt_algorithm == "HS256" and self.jwt_public_key_file is not None:
            raise _error("security.jwt_public_key_file", "is for RS256 and EdDSA; HS256 takes jwt_secret_file",
                         "security.jwt_algorithm")
        if self.jwt_algorithm != "HS256" and self.jwt_secret_file is not None:
            raise _error("security.jwt_secret_file",
                         f"is for HS256; {self.jwt_algorithm} takes jwt_public_key_file", "security.jwt_algorithm")
        _check_range("security.jwt_token_bytes_max", self.jwt_token_bytes_max, 256, 65536)
        if (self.metrics_tls_cert_file is None) != (self.metrics_tls_key_file is None):
            raise _error("security.metrics_tls_key_file", "and security.metrics_tls_cert_file go together: set both"
                         " (HTTPS) or neither (HTTP)", "security.metrics_tls_cert_file")
        if (self.grpc_tls_cert_file is None) != (self.grpc_tls_key_file is None):
            raise _error("security.grpc_tls_key_file", "and security.grpc_tls_cert_file go together: set both"
                         " (TLS) or neither (plaintext)", "security.grpc_tls_cert_file")
        if self.grpc_tls_client_ca_file is not None and self.grpc_tls_cert_file is None:
            raise _error("security.grpc_tls_client_ca_file", "needs security.grpc_tls_cert_file and"
                         " security.grpc_tls_key_file (mutual TLS is TLS first)", "security.grpc_tls_cert_file")


LOG_FORMATS = ("text", "json")


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggingSection:
    """How the broker writes its log on stderr (`cli/logs.py`)."""

    SECTION: ClassVar[str] = "logging"

    # text: rich on a terminal, one plain line per record otherwise (a file, a pipe);
    # json: one JSON object per line (time, level, logger, message, exc). Default text.
    format: str = "text"
    # A warning with the same logger and message (numbers folded) as one logged less
    # than this long ago is held back; the next one let through says how many were. 0: log every one, ms.
    # Default 60000.
    repeat_interval_ms: int = 60_000

    def __post_init__(self) -> None:
        _check_types(self)
        if self.format not in LOG_FORMATS:
            raise _error("logging.format", f"must be one of {', '.join(LOG_FORMATS)}, got {self.format!r}")
        _check_range("logging.repeat_interval_ms", self.repeat_interval_ms, 0, 86_400_000)


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerConfig:
    """The whole broker configuration: one field per section, plus top-level keys."""

    SECTION: ClassVar[str] = ""

    broker: BrokerSection = field(default_factory=BrokerSection)
    limits: LimitsSection = field(default_factory=LimitsSection)
    dispatch: DispatchSection = field(default_factory=DispatchSection)
    policies: PoliciesSection = field(default_factory=PoliciesSection)
    storage: StorageSection = field(default_factory=StorageSection)
    reliable: ReliableSection = field(default_factory=ReliableSection)
    cluster: ClusterSection = field(default_factory=ClusterSection)
    load_manager: LoadManagerSection = field(default_factory=LoadManagerSection)
    snapshots: SnapshotsSection = field(default_factory=SnapshotsSection)
    security: SecuritySection = field(default_factory=SecuritySection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    # Create a topic when a client first uses it (in an existing namespace) instead of
    # refusing with NOT_FOUND: a producer, or a subscriber where
    # policies.allow_auto_topic_creation allows it. False: only admins create. Default true.
    auto_create_topics: bool = True
    # Namespaces created at cluster start if missing; each a valid namespace
    # name (1..255 of A-Z a-z 0-9 _ -), no duplicates. Default [default].
    bootstrap_namespaces: tuple[str, ...] = ("default",)

    def __post_init__(self) -> None:
        if isinstance(self.bootstrap_namespaces, list):
            # YAML gives lists; keep the frozen config hashable and immutable.
            object.__setattr__(
                self, "bootstrap_namespaces", tuple(self.bootstrap_namespaces)
            )
        _check_types(self)
        seen: set[str] = set()
        for namespace in self.bootstrap_namespaces:
            try:
                validate_namespace(namespace)
            except InvalidArgument as err:
                raise _error("bootstrap_namespaces", err.message) from None
            if namespace in seen:
                raise _error(
                    "bootstrap_namespaces", f"namespace {namespace!r} is listed twice"
                )
            seen.add(namespace)
        envelope_min = self.policies.max_message_size + ENVELOPE_BYTES_MAX
        if self.limits.frame_bytes_max <= envelope_min:
            raise _error(
                "limits.frame_bytes_max",
                f"must be greater than policies.max_message_size + 1 MiB for the envelope "
                f"({self.policies.max_message_size} + {ENVELOPE_BYTES_MAX} = {envelope_min}), "
                f"got {self.limits.frame_bytes_max}",
                "policies.max_message_size",
            )
        _check_at_least("dispatch.pending_bytes_max", self.dispatch.pending_bytes_max, "policies.max_message_size",
                        self.policies.max_message_size,
                        "the largest message (policies.max_message_size)")
        for door in ("grpc_listen", "grpc_admin_listen"):
            if (getattr(self.broker, door) is not None and self.security.mode != "none"
                    and self.security.grpc_tls_cert_file is None):
                # The door's callers send their bearer token in every call: never in clear.
                raise _error(f"broker.{door}", "needs TLS with security.mode curve: set"
                             " security.grpc_tls_cert_file and security.grpc_tls_key_file", "security.mode")
        if self.cluster.move_chunk_bytes_max > self.limits.frame_bytes_max - 64 * 1024:
            raise _error(
                "cluster.move_chunk_bytes_max",
                f"must be at most limits.frame_bytes_max less 64 KiB ({self.limits.frame_bytes_max - 64 * 1024}),"
                f" got {self.cluster.move_chunk_bytes_max}",
                "limits.frame_bytes_max",
            )

    def to_dict(self) -> dict[str, object]:
        """The configuration as plain YAML-ready data (`--print-config`).

        Feeding it back through a YAML file gives an equal BrokerConfig.
        """
        out: dict[str, object] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(value):
                out[f.name] = {
                    g.name: getattr(value, g.name) for g in dataclasses.fields(value)
                }
            elif isinstance(value, tuple):
                out[f.name] = list(value)
            else:
                out[f.name] = value
        return out


_SECTIONS: tuple[type, ...] = (
    BrokerSection,
    LimitsSection,
    DispatchSection,
    PoliciesSection,
    StorageSection,
    ReliableSection,
    ClusterSection,
    LoadManagerSection,
    SnapshotsSection,
    SecuritySection,
    LoggingSection,
)


# --------------------------------------------------------------------------
# Field checks
# --------------------------------------------------------------------------


def _error(key: str, problem: str, *related_keys: str) -> ConfigError:
    """A ConfigError naming `key`; `config_keys` lets the loader add where values came from."""
    err = ConfigError(f"config key {key!r}: {problem}")
    err.config_keys = (key, *related_keys)  # type: ignore[attr-defined]
    return err


@functools.cache
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _accepts(hint: object, value: object) -> bool:
    """Whether `value` has the type `hint` (the few types config fields use)."""
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        # bool is an int subclass; `true` is not a number of anything.
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if hint is type(None):
        return value is None
    if isinstance(hint, types.UnionType):
        return any(_accepts(arm, value) for arm in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        return isinstance(value, tuple) and all(_accepts(item, v) for v in value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return isinstance(value, hint)
    raise AssertionError(f"config field type {hint!r} is not supported")


def _describe(hint: object) -> str:
    if hint is bool:
        return "a boolean (true or false)"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint is str:
        return "a string"
    if hint is type(None):
        return "null"
    if isinstance(hint, types.UnionType):
        return " or ".join(_describe(arm) for arm in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        assert typing.get_args(hint)[0] is str, hint
        return "a list of strings"
    return "a mapping"


def _check_types(obj: object) -> None:
    cls = type(obj)
    hints = _hints(cls)
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        if not _accepts(hints[f.name], value):
            key = f"{cls.SECTION}.{f.name}" if cls.SECTION else f.name  # type: ignore[attr-defined]
            raise _error(key, f"expected {_describe(hints[f.name])}, got {value!r}")


def _check_range(key: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        # ">= 1" reads better than "between 1 and 9223372036854775807".
        too_small_only = value < low and high == _INT_MAX
        bound = f">= {low}" if too_small_only else f"between {low} and {high}"
        raise _error(key, f"must be {bound}, got {value}")


def _check_at_least(key: str, value: int, floor_key: str, floor: int, what: str) -> None:
    """`value` of `key` must be at least `floor`, which `floor_key` sets: an error naming
    both keys and the value needed, so that raising one limit says which other to raise."""
    if value < floor:
        raise _error(key, f"must be at least {floor}, {what}, got {value}: raise it, or lower {floor_key}",
                     floor_key)


def _is_ephemeral(endpoint: str) -> bool:
    """A tcp endpoint whose port the OS picks: binding it twice is no conflict."""
    return endpoint.startswith("tcp://") and endpoint.endswith((":*", ":0"))


def _check_endpoint(key: str, endpoint: str) -> None:
    scheme = next((s for s in _ENDPOINT_SCHEMES if endpoint.startswith(s)), None)
    if scheme is None or len(endpoint) == len(scheme):
        raise _error(
            key,
            f"expected a ZeroMQ endpoint starting with tcp://, ipc:// or inproc://, got {endpoint!r}",
        )
    if scheme == "tcp://":
        host, colon, port = endpoint[len(scheme) :].rpartition(":")
        port_ok = port == "*" or (
            port.isascii() and port.isdigit() and int(port) <= _PORT_MAX
        )
        if not (colon and host and port_ok):
            raise _error(
                key,
                f"expected tcp://HOST:PORT with PORT 0..{_PORT_MAX} or *, got {endpoint!r}",
            )


def _check_http_endpoint(key: str, endpoint: str, schemes: tuple[str, ...] = ("http",)) -> None:
    """A gRPC address as Danube's clients are given one: http://HOST:PORT (or another of
    `schemes`)."""
    scheme, sep, rest = endpoint.partition("://")
    host, colon, port = rest.rpartition(":")
    port_ok = port.isascii() and port.isdigit() and int(port) <= _PORT_MAX
    if not (sep and scheme in schemes and colon and host and port_ok) or "/" in host:
        shown = "|".join(schemes)
        raise _error(key, f"expected {shown}://HOST:PORT with PORT 0..{_PORT_MAX}, got {endpoint!r}")


# --------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------


def _key_hints() -> dict[str, object]:
    """Every leaf config key, dotted (`broker.listen`), with its field type."""
    keys: dict[str, object] = {}
    for f in dataclasses.fields(BrokerConfig):
        hint = _hints(BrokerConfig)[f.name]
        if hint in _SECTIONS:
            assert hint.SECTION == f.name, (hint, f.name)  # type: ignore[attr-defined]
            for g in dataclasses.fields(hint):  # type: ignore[arg-type]
                keys[f"{f.name}.{g.name}"] = _hints(hint)[g.name]  # type: ignore[arg-type]
        else:
            keys[f.name] = hint
    return keys


_KEY_HINTS = _key_hints()
_SECTION_NAMES = frozenset(cls.SECTION for cls in _SECTIONS)  # type: ignore[attr-defined]


def env_var_name(key: str) -> str:
    """The environment variable for a dotted key: broker.listen -> DANUBE_BROKER__LISTEN."""
    return _ENV_PREFIX + key.upper().replace(".", "__")


def _unknown_key(key: str, where: str) -> ConfigError:
    section, dot, name = key.partition(".")
    if dot and section in _SECTION_NAMES:
        # Match the name within its section: with the shared "broker." prefix
        # every broker key would look close.
        names = [k.partition(".")[2] for k in _KEY_HINTS if k.startswith(section + ".")]
        close = difflib.get_close_matches(name, names, n=1)
        if close:
            hint = f"; did you mean '{section}.{close[0]}'?"
        else:
            hint = f"; {section} has {', '.join(names)}"
    else:
        # Like with like: dotted against dotted, top-level against top-level.
        candidates = [
            k for k in (*_KEY_HINTS, *_SECTION_NAMES) if ("." in k) == bool(dot)
        ]
        close = difflib.get_close_matches(key, candidates, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint} (from {where})")


def _check_known(key: str, where: str) -> None:
    if key in _KEY_HINTS:
        return
    if key in _SECTION_NAMES:
        example = next(k for k in _KEY_HINTS if k.startswith(key + "."))
        raise ConfigError(
            f"config key {key!r} is a section; set its keys one by one, "
            f"e.g. {example!r} (from {where})"
        )
    raise _unknown_key(key, where)


def _read_yaml(path: str | os.PathLike[str]) -> Iterator[tuple[str, object, str]]:
    """Yield (dotted key, value, 'file' line N) for every key set in a YAML config file."""
    shown = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise ConfigError(f"config file {shown!r} not found") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"config file {shown!r} is not UTF-8 text: {err.reason}"
        ) from None
    except OSError as err:
        raise ConfigError(
            f"config file {shown!r} cannot be read: {err.strerror}"
        ) from None

    # Walk the node tree instead of yaml.safe_load: it keeps line numbers for
    # messages, and catches a key given twice (safe_load keeps the last silently).
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:  # empty or comments only: all defaults
            return
        if not isinstance(root, yaml.MappingNode):
            raise ConfigError(
                f"config file {shown!r}: the top level must be a mapping of config keys, "
                f"got {loader.construct_object(root, deep=True)!r}"
            )
        for key, node, where in _mapping_items(loader, root, "", shown):
            if key in _SECTION_NAMES:
                if (
                    isinstance(node, yaml.ScalarNode)
                    and node.tag == "tag:yaml.org,2002:null"
                ):
                    continue  # `broker:` with every key commented out
                if not isinstance(node, yaml.MappingNode):
                    value = loader.construct_object(node, deep=True)
                    raise ConfigError(
                        f"config key {key!r}: expected a mapping of {key}.* keys, "
                        f"got {value!r} (from {where})"
                    )
                for sub_key, sub_node, sub_where in _mapping_items(
                    loader, node, key, shown
                ):
                    _check_known(sub_key, sub_where)
                    yield (
                        sub_key,
                        loader.construct_object(sub_node, deep=True),
                        sub_where,
                    )
            elif "." in key:
                # Dotted keys are for overrides; in a file, sections nest.
                raise ConfigError(
                    f"config key {key!r}: write it nested under its section in a file, "
                    f"'{key.partition('.')[0]}:' then '{key.partition('.')[2]}:' (from {where})"
                )
            else:
                _check_known(key, where)
                yield key, loader.construct_object(node, deep=True), where
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = err.problem or err.context or "invalid YAML"
        raise ConfigError(
            f"config file {shown!r}: YAML syntax error{at}: {problem}"
        ) from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {shown!r}: YAML syntax error: {err}") from None
    finally:
        loader.dispose()


def _mapping_items(
    loader: yaml.SafeLoader, node: yaml.MappingNode, prefix: str, shown: str
) -> Iterator[tuple[str, yaml.Node, str]]:
    seen: dict[str, int] = {}
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        name = loader.construct_object(key_node, deep=True)
        key = f"{prefix}.{name}" if prefix else str(name)
        where = f"{shown!r} line {line}"
        if key in seen:
            raise ConfigError(
                f"config key {key!r} is set twice, at lines {seen[key]} and {line} (from {shown!r})"
            )
        seen[key] = line
        yield key, value_node, where


def _parse_env(raw: str, hint: object) -> object:
    """An environment value read as a YAML scalar, as far as the key's type wants."""
    if typing.get_origin(hint) is tuple and not raw.lstrip().startswith("["):
        return [item.strip() for item in raw.split(",") if item.strip()]
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw  # not YAML: the type check will report the raw text
    if _accepts(hint, "") and not _accepts(hint, value):
        # A string key keeps its text as given: DANUBE_BROKER__DATA_DIR=2024
        # is the directory "2024", not a type error.
        return raw
    return value


def _with_sources(err: ConfigError, sources: Mapping[str, str]) -> ConfigError:
    """err with where its keys' values came from appended, when they were set."""
    keys = getattr(err, "config_keys", ())
    known = [(key, sources[key]) for key in keys if key in sources]
    if not known:
        return err
    if [key for key, _ in known] == [keys[0]]:
        suffix = f" (from {known[0][1]})"
    else:
        suffix = " (" + "; ".join(f"{key} from {source}" for key, source in known) + ")"
    return ConfigError(err.message + suffix)


def _build(values: Mapping[str, object]) -> BrokerConfig:
    sections: dict[str, object] = {}
    for cls in _SECTIONS:
        prefix = cls.SECTION + "."  # type: ignore[attr-defined]
        kwargs = {
            key[len(prefix) :]: v for key, v in values.items() if key.startswith(prefix)
        }
        sections[cls.SECTION] = cls(**kwargs)  # type: ignore[attr-defined]
    top = {key: v for key, v in values.items() if "." not in key}
    return BrokerConfig(**sections, **top)  # type: ignore[arg-type]


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> BrokerConfig:
    """Load and validate the configuration: defaults < file < environment < overrides.

    `path` None means no file. `env` None means `os.environ`; pass `{}` to
    ignore the environment. Raises ConfigError naming the key at fault.
    """
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    if path is not None:
        for key, value, where in _read_yaml(path):
            values[key] = value
            sources[key] = where
    environ = os.environ if env is None else env
    for key, hint in _KEY_HINTS.items():
        name = env_var_name(key)
        if name in environ:
            values[key] = _parse_env(environ[name], hint)
            sources[key] = f"environment variable {name}"
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        _check_known(key, "overrides")
        values[key] = value
        sources[key] = "overrides"
    try:
        return _build(values)
    except ConfigError as err:
        raise _with_sources(err, sources) from None

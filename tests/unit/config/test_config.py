"""Broker configuration: defaults, sources and their precedence, and errors naming the key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from danube_zmq.config.broker_config import (
    MIB,
    BrokerConfig,
    BrokerSection,
    LimitsSection,
    PoliciesSection,
    env_var_name,
    load_config,
)
from danube_zmq.transport.errors import ConfigError, InvalidArgument
from tests.paths import ROOT

SAMPLE = ROOT / "config" / "danube_broker.yml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "broker.yml"
    path.write_text(text, encoding="utf-8")
    return path


def load_error(*args: object, **kwargs: object) -> str:
    kwargs.setdefault("env", {})
    with pytest.raises(ConfigError) as info:
        load_config(*args, **kwargs)  # type: ignore[arg-type]
    return str(info.value)


# ---------------------------------------------------------------- defaults


def test_defaults_without_file_env_or_overrides() -> None:
    """With no source at all, load_config gives the documented defaults."""
    config = load_config(env={})
    assert config == BrokerConfig()
    assert config.broker.listen == "tcp://127.0.0.1:6650"
    assert config.broker.advertised == "tcp://127.0.0.1:6650"
    assert config.broker.broker_id is None
    assert config.limits.frame_bytes_max == 16 * MIB
    assert config.policies.max_message_size == 10485760
    assert config.auto_create_topics is True
    assert config.bootstrap_namespaces == ("default",)


def test_sample_file_equals_the_defaults() -> None:
    """config/danube_broker.yml spells out every default, and nothing else."""
    assert load_config(SAMPLE, env={}) == BrokerConfig()


def test_sample_file_lists_every_field() -> None:
    """Every dataclass field appears in the sample, so the sample stays complete."""
    sample = yaml.safe_load(SAMPLE.read_text(encoding="utf-8"))
    in_sample: set[str] = set()
    for key, value in sample.items():
        if isinstance(value, dict):
            in_sample.update(f"{key}.{sub}" for sub in value)
        else:
            in_sample.add(key)
    fields: set[str] = set()
    for f in dataclasses.fields(BrokerConfig):
        default = getattr(BrokerConfig(), f.name)
        if dataclasses.is_dataclass(default):
            fields.update(f"{f.name}.{g.name}" for g in dataclasses.fields(default))
        else:
            fields.add(f.name)
    assert in_sample == fields


def test_to_dict_round_trips_through_yaml(tmp_path: Path) -> None:
    """to_dict() dumped as YAML loads back into an equal config."""
    config = load_config(
        env={},
        overrides={"broker.broker_id": 7, "bootstrap_namespaces": ["a", "b"]},
    )
    data = config.to_dict()
    assert data["broker"]["broker_id"] == 7  # type: ignore[index]
    assert data["bootstrap_namespaces"] == ["a", "b"]
    path = write(tmp_path, yaml.safe_dump(data))
    assert load_config(path, env={}) == config


# ------------------------------------------------------- sources and order


def test_file_overrides_defaults_and_keeps_the_rest(tmp_path: Path) -> None:
    """Keys set in the file win; keys not set keep their defaults."""
    path = write(
        tmp_path,
        """
broker:
  listen: "tcp://0.0.0.0:7000"
  advertised_url: "tcp://broker-1.example:7000"
policies:
  max_consumers_per_subscription: 3
auto_create_topics: false
bootstrap_namespaces: [default, tenant_1]
""",
    )
    config = load_config(path, env={})
    assert config.broker.listen == "tcp://0.0.0.0:7000"
    assert config.broker.advertised == "tcp://broker-1.example:7000"
    assert config.broker.admin_listen == "tcp://127.0.0.1:50051"
    assert config.policies.max_consumers_per_subscription == 3
    assert config.auto_create_topics is False
    assert config.bootstrap_namespaces == ("default", "tenant_1")
    assert config.limits == LimitsSection()


def test_empty_file_and_empty_section_mean_defaults(tmp_path: Path) -> None:
    """A file of comments only, or a section whose keys are all commented out, is all defaults."""
    assert load_config(write(tmp_path, "# nothing\n"), env={}) == BrokerConfig()
    assert (
        load_config(write(tmp_path, "broker:\n  # listen: x\n"), env={})
        == BrokerConfig()
    )


def test_environment_overrides_file(tmp_path: Path) -> None:
    """DANUBE_<SECTION>__<KEY> beats the file; values are YAML scalars."""
    path = write(
        tmp_path, "broker:\n  listen: tcp://127.0.0.1:7000\nauto_create_topics: true\n"
    )
    config = load_config(
        path,
        env={
            "DANUBE_BROKER__LISTEN": "tcp://127.0.0.1:8000",
            "DANUBE_POLICIES__MAX_MESSAGE_SIZE": "42",
            "DANUBE_AUTO_CREATE_TOPICS": "false",
            "DANUBE_BOOTSTRAP_NAMESPACES": "default, tenant_1",
        },
    )
    assert config.broker.listen == "tcp://127.0.0.1:8000"
    assert config.policies.max_message_size == 42
    assert config.auto_create_topics is False
    assert config.bootstrap_namespaces == ("default", "tenant_1")


def test_environment_string_keys_keep_their_text() -> None:
    """A string key is not retyped by YAML: DATA_DIR=2024 is the directory '2024'."""
    config = load_config(
        env={
            "DANUBE_BROKER__DATA_DIR": "2024",
            "DANUBE_BROKER__ADVERTISED_URL": "null",
            "DANUBE_BOOTSTRAP_NAMESPACES": "[a, b]",
        }
    )
    assert config.broker.data_dir == "2024"
    assert config.broker.advertised_url is None
    assert config.bootstrap_namespaces == ("a", "b")


def test_other_danube_variables_are_ignored() -> None:
    """DANUBE_* variables that are not config keys (the client's, typos) are left alone."""
    config = load_config(
        env={
            "DANUBE_SERVICE_URL": "http://x",
            "DANUBE_BROKER": "5",
            "DANUBE_BROKER__LISEN": "x",
        }
    )
    assert config == BrokerConfig()


def test_overrides_beat_environment_and_none_is_skipped(tmp_path: Path) -> None:
    """Overrides (CLI flags) win over everything; a None override is a flag not given."""
    path = write(tmp_path, "broker:\n  metrics_port: 1\n")
    config = load_config(
        path,
        env={
            "DANUBE_BROKER__METRICS_PORT": "2",
            "DANUBE_BROKER__LISTEN": "tcp://127.0.0.1:8000",
        },
        overrides={"broker.metrics_port": 3, "broker.listen": None},
    )
    assert config.broker.metrics_port == 3
    assert config.broker.listen == "tcp://127.0.0.1:8000"


def test_env_var_name() -> None:
    """Sections and keys are joined by a double underscore, all upper case."""
    assert env_var_name("broker.listen") == "DANUBE_BROKER__LISTEN"
    assert env_var_name("auto_create_topics") == "DANUBE_AUTO_CREATE_TOPICS"


def test_config_errors_are_invalid_arguments() -> None:
    """ConfigError belongs to the error tree under InvalidArgument."""
    assert issubclass(ConfigError, InvalidArgument)


# ------------------------------------------------------------------ errors


def test_unknown_key_in_file_suggests_the_closest(tmp_path: Path) -> None:
    """A misspelt key is refused with the closest known key and the line it is on."""
    message = load_error(write(tmp_path, "broker:\n  lisen: tcp://127.0.0.1:1\n"))
    assert message.startswith("unknown config key 'broker.lisen'")
    assert "did you mean 'broker.listen'?" in message
    assert "line 2" in message


def test_unknown_section_and_top_level_key(tmp_path: Path) -> None:
    """Unknown sections and top-level keys are refused too."""
    assert "did you mean 'broker'?" in load_error(
        write(tmp_path, "brokr:\n  listen: x\n")
    )
    message = load_error(write(tmp_path, "auto_create_topic: true\n"))
    assert "unknown config key 'auto_create_topic'" in message
    assert "did you mean 'auto_create_topics'?" in message


def test_unknown_key_without_close_match_lists_the_section(tmp_path: Path) -> None:
    """With nothing close, the message lists the keys the section does have."""
    message = load_error(write(tmp_path, "broker:\n  bogus: 1\n"))
    assert message.startswith(
        "unknown config key 'broker.bogus'; broker has broker_id, listen, admin_listen"
    )


def test_dotted_key_in_file_is_refused(tmp_path: Path) -> None:
    """In a file, sections nest; a dotted key would bypass the duplicate check."""
    message = load_error(write(tmp_path, "limits.connections_max: 5\n"))
    assert "config key 'limits.connections_max'" in message
    assert "nested" in message


def test_unknown_override_key() -> None:
    """An override for a key that does not exist is refused, with a suggestion."""
    message = load_error(overrides={"broker.lisen": "tcp://127.0.0.1:1"})
    assert message.startswith(
        "unknown config key 'broker.lisen'; did you mean 'broker.listen'?"
    )
    assert "(from overrides)" in message
    assert "is a section" in load_error(overrides={"broker": {"listen": "x"}})


def test_wrong_type_names_key_value_and_source() -> None:
    """A value of the wrong type is refused naming key, expected type, value and source."""
    message = load_error(env={"DANUBE_POLICIES__MAX_MESSAGE_SIZE": "abc"})
    assert message == (
        "config key 'policies.max_message_size': expected an integer, got 'abc' "
        "(from environment variable DANUBE_POLICIES__MAX_MESSAGE_SIZE)"
    )


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("limits.connections_max", True, "expected an integer, got True"),
        ("limits.connections_max", 1.5, "expected an integer, got 1.5"),
        ("auto_create_topics", 1, "expected a boolean (true or false), got 1"),
        ("broker.listen", 6650, "expected a string, got 6650"),
        ("broker.broker_id", "one", "expected an integer or null, got 'one'"),
        (
            "bootstrap_namespaces",
            "default",
            "expected a list of strings, got 'default'",
        ),
    ],
)
def test_wrong_types(key: str, value: object, expected: str) -> None:
    """bool is not an int, an int is not a bool, and so on."""
    message = load_error(overrides={key: value})
    assert message.startswith(f"config key {key!r}: {expected}")


def test_section_that_is_not_a_mapping(tmp_path: Path) -> None:
    """A section given a scalar is refused naming the section."""
    message = load_error(write(tmp_path, "limits: 5\n"))
    assert message.startswith("config key 'limits': expected a mapping")


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("limits.connections_max", 0, "must be >= 1, got 0"),
        ("limits.mailbox_bytes_max", 0, f"must be at least {16 * MIB}, the largest frame"),
        ("limits.outbound_frames_max", 2**31, "must be between 1 and 2147483647"),
        ("dispatch.pending_messages_max", -1, "must be >= 1, got -1"),
        ("policies.max_producers_per_topic", -1, "must be >= 0, got -1"),
        ("policies.max_message_size", 0, "must be >= 1, got 0"),
        ("broker.metrics_port", 70000, "must be between 0 and 65535, got 70000"),
        ("broker.broker_id", -5, "must be >= 0, got -5"),
        ("broker.broker_id", 2**63, "must be between 0 and 9223372036854775807"),
        ("broker.data_dir", "", "must not be empty"),
        ("broker.event_loop", "trio", "must be one of uvloop, asyncio, got 'trio'"),
        ("limits.admin_principals_max", 0, "must be >= 1, got 0"),
        ("limits.admin_principals_bytes_max", 1000, "must be >= 65536, got 1000"),
    ],
)
def test_out_of_range(key: str, value: object, expected: str) -> None:
    """Values outside their range are refused naming the key and the bound."""
    message = load_error(overrides={key: value})
    assert message.startswith(f"config key {key!r}: {expected}")


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://127.0.0.1:6650",
        "127.0.0.1:6650",
        "tcp://",
        "tcp://127.0.0.1",
        "tcp://:6650",
        "tcp://127.0.0.1:99999",
        "tcp://127.0.0.1:http",
    ],
)
def test_bad_endpoints(endpoint: str) -> None:
    """Endpoints must be ZeroMQ tcp://HOST:PORT, ipc:// or inproc:// addresses."""
    message = load_error(overrides={"broker.advertised_url": endpoint})
    assert message.startswith("config key 'broker.advertised_url': expected")
    assert repr(endpoint) in message


@pytest.mark.parametrize(
    "endpoint",
    [
        "tcp://0.0.0.0:0",
        "tcp://*:*",
        "tcp://[::1]:6650",
        "ipc:///tmp/danube.sock",
        "inproc://b",
    ],
)
def test_good_endpoints(endpoint: str) -> None:
    """Wildcards, ephemeral ports, IPv6, ipc and inproc are accepted."""
    assert (
        load_config(env={}, overrides={"broker.listen": endpoint}).broker.listen
        == endpoint
    )


def test_listen_and_admin_listen_must_differ() -> None:
    """Two sockets cannot bind the same fixed endpoint; ephemeral ports are fine."""
    message = load_error(overrides={"broker.admin_listen": "tcp://127.0.0.1:6650"})
    assert message.startswith(
        "config key 'broker.admin_listen': must differ from broker.listen"
    )
    same = {
        "broker.listen": "tcp://127.0.0.1:0",
        "broker.admin_listen": "tcp://127.0.0.1:0",
    }
    assert (
        load_config(env={}, overrides=same).broker.admin_listen == "tcp://127.0.0.1:0"
    )


def test_frame_must_fit_the_largest_message_and_envelope() -> None:
    """frame_bytes_max must exceed max_message_size + 1 MiB; both sources are named."""
    message = load_error(
        env={"DANUBE_POLICIES__MAX_MESSAGE_SIZE": str(15 * MIB)},
    )
    assert message.startswith(
        "config key 'limits.frame_bytes_max': must be greater than "
        "policies.max_message_size + 1 MiB"
    )
    assert "policies.max_message_size from environment variable" in message
    # Exactly max + 1 MiB is still too small; one byte more is enough.
    edge = {"policies.max_message_size": MIB, "limits.frame_bytes_max": 2 * MIB}
    assert "must be greater" in load_error(overrides=edge)
    edge["limits.frame_bytes_max"] = 2 * MIB + 1
    assert load_config(env={}, overrides=edge).limits.frame_bytes_max == 2 * MIB + 1


def test_bad_bootstrap_namespaces() -> None:
    """Namespace names follow the topic-name rules, and may not repeat."""
    message = load_error(overrides={"bootstrap_namespaces": ["default", "a b"]})
    assert message.startswith(
        "config key 'bootstrap_namespaces': invalid namespace name 'a b'"
    )
    message = load_error(overrides={"bootstrap_namespaces": ["x", "x"]})
    assert "listed twice" in message


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    """Broken YAML is reported with the file name and the line of the problem."""
    path = write(tmp_path, "broker:\n  listen: [tcp://x\nlimits: {}\n")
    message = load_error(path)
    assert message.startswith(f"config file {str(path)!r}: YAML syntax error at line 3")


def test_duplicate_key_is_refused(tmp_path: Path) -> None:
    """A key given twice is an error rather than last-one-wins."""
    message = load_error(
        write(tmp_path, "broker:\n  metrics_port: 1\n  metrics_port: 2\n")
    )
    assert message.startswith(
        "config key 'broker.metrics_port' is set twice, at lines 2 and 3"
    )


def test_missing_file(tmp_path: Path) -> None:
    """A config path that does not exist is an error, not silently the defaults."""
    path = tmp_path / "nope.yml"
    assert load_error(path) == f"config file {str(path)!r} not found"


@pytest.mark.parametrize("text", ["- a\n- b\n", "just text\n", "42\n"])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str) -> None:
    """A file whose top level is a list or scalar is refused."""
    message = load_error(write(tmp_path, text))
    assert "the top level must be a mapping" in message


def test_file_errors_name_the_line(tmp_path: Path) -> None:
    """A bad value from a file is reported with its file and line."""
    path = write(tmp_path, "# comment\nlimits:\n  connections_max: many\n")
    message = load_error(path)
    assert message == (
        "config key 'limits.connections_max': expected an integer, got 'many' "
        f"(from {str(path)!r} line 3)"
    )


def test_sections_validate_when_built_directly() -> None:
    """The dataclasses check themselves, so no invalid config exists however it is built."""
    with pytest.raises(ConfigError, match=r"'policies\.max_message_size'"):
        PoliciesSection(max_message_size=0)
    with pytest.raises(ConfigError, match=r"'broker\.listen'"):
        BrokerSection(listen="localhost:6650")
    with pytest.raises(ConfigError, match=r"'limits\.frame_bytes_max'"):
        BrokerConfig(limits=LimitsSection(frame_bytes_max=MIB))
    with pytest.raises(dataclasses.FrozenInstanceError):
        BrokerConfig().auto_create_topics = False  # type: ignore[misc]


def test_dead_letter_topic_must_be_a_valid_topic_name() -> None:
    """A malformed dead-letter topic is refused at load, naming the key."""
    with pytest.raises(ConfigError, match=r"reliable\.dead_letter_topic"):
        load_config(None, env={}, overrides={"reliable.poison_policy": "dead_letter",
                                             "reliable.dead_letter_topic": "not a topic"})


def test_cluster_section_from_environment() -> None:
    config = load_config(env={
        "DANUBE_CLUSTER__NODE_ID": "2",
        "DANUBE_CLUSTER__RAFT_LISTEN": "tcp://127.0.0.1:6662",
        "DANUBE_CLUSTER__PEERS": "1=tcp://127.0.0.1:6661, 2=tcp://127.0.0.1:6662,3=tcp://127.0.0.1:6663",
    })
    cluster = config.cluster
    assert cluster.peer_addresses() == {1: "tcp://127.0.0.1:6661", 2: "tcp://127.0.0.1:6662", 3: "tcp://127.0.0.1:6663"}
    assert cluster.ticks == (2, 10, 20)  # 100 ms heartbeats, 500-1000 ms elections at 50 ms ticks
    assert load_config().cluster.peer_addresses() == {}  # standalone by default


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"cluster.peers": ["1=tcp://127.0.0.1:1"]}, "cluster.raft_listen' ... is required when cluster.peers"),
        ({"cluster.join": True}, "is required when cluster.join is true"),
        ({"cluster.raft_listen": "ipc:///tmp/r"}, "raft peers talk over tcp://"),
        ({"cluster.raft_listen": "tcp://127.0.0.1:1", "cluster.peers": ["one=tcp://127.0.0.1:1"]},
         "each entry is ID=tcp://HOST:PORT"),
        ({"cluster.raft_listen": "tcp://127.0.0.1:1", "cluster.peers": ["1=tcp://a:1", "1=tcp://b:1"]},
         "node 1 is listed twice"),
        ({"cluster.raft_listen": "tcp://127.0.0.1:1", "cluster.peers": ["2=tcp://a:1", "3=tcp://b:1"]},
         "founding voters must include this node"),
        ({"cluster.election_timeout_ms_min": 100}, "cluster.election_timeout_ms_min"),
        ({"cluster.election_timeout_ms_max": 500}, "cluster.election_timeout_ms_max"),
        ({"cluster.node_id": 0}, "cluster.node_id"),
    ],
)
def test_cluster_section_errors(overrides: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    for part in expected.split(" ... "):
        assert part in str(info.value), str(info.value)


def test_subscriptions_per_topic_are_bounded_by_default() -> None:
    """Each subscription with a consumer may hold `dispatch.pending_bytes_max`, so the
    number of subscriptions of a topic has a default bound (not 0 = unlimited), in the
    defaults and in the sample."""
    limit = BrokerConfig().policies.max_subscriptions_per_topic
    assert 0 < limit <= 10_000
    assert f"max_subscriptions_per_topic: {limit}\n" in SAMPLE.read_text()


def test_inbound_budget_must_exceed_the_largest_frame() -> None:
    """A connection must be able to deliver one whole frame of frame_bytes_max: an
    inbound budget not above it is refused, naming the key; the default is valid."""
    assert LimitsSection().inbound_bytes_per_connection_max > LimitsSection().frame_bytes_max
    with pytest.raises(ConfigError, match=r"limits\.inbound_bytes_per_connection_max"):
        LimitsSection(inbound_bytes_per_connection_max=16 * MIB)
    LimitsSection(inbound_bytes_per_connection_max=16 * MIB + 1)


def test_broker_inbound_budget_is_at_least_one_connections() -> None:
    """The inbound budget of all connections together must hold one connection's:
    below it is refused, naming the key; equal is accepted; the default is valid."""
    assert LimitsSection().inbound_bytes_max >= LimitsSection().inbound_bytes_per_connection_max
    with pytest.raises(ConfigError, match=r"limits\.inbound_bytes_max"):
        LimitsSection(inbound_bytes_per_connection_max=32 * MIB, inbound_bytes_max=32 * MIB - 1)
    LimitsSection(inbound_bytes_per_connection_max=32 * MIB, inbound_bytes_max=32 * MIB)


# Each limit that depends on another: (its key, a value too small for the other's
# default or for `others`, the others, the value it needs). Raising one limit past its
# dependent's is refused at load, naming both keys and the value needed (issue 38).
DEPENDENT_LIMITS = [
    ("limits.inbound_bytes_per_connection_max", 24 * MIB, {"limits.frame_bytes_max": 24 * MIB},
     24 * MIB + 1, "limits.frame_bytes_max"),
    ("limits.inbound_bytes_max", 63 * MIB, {}, 64 * MIB, "limits.inbound_bytes_per_connection_max"),
    ("limits.outbound_bytes_max", 31 * MIB, {}, 32 * MIB, "limits.outbound_bytes_per_connection_max"),
    ("limits.mailbox_bytes_max", 32 * MIB, {"limits.frame_bytes_max": 48 * MIB,
                                            "limits.inbound_bytes_per_connection_max": 64 * MIB + 1},
     48 * MIB, "limits.frame_bytes_max"),
    ("dispatch.pending_bytes_max", 16 * MIB, {"policies.max_message_size": 20_000_000,
                                              "limits.frame_bytes_max": 24 * MIB},
     20_000_000, "policies.max_message_size"),
]


@pytest.mark.parametrize(("key", "value", "others", "needed", "other_key"), DEPENDENT_LIMITS)
def test_a_limit_below_the_one_it_depends_on_is_refused_naming_both(
        key: str, value: int, others: dict[str, int], needed: int, other_key: str) -> None:
    message = load_error(overrides={**others, key: value})
    assert message.startswith(f"config key {key!r}: must be at least {needed}, "), message
    assert f"got {value}: raise it, or lower {other_key}" in message, message
    assert load_config(env={}, overrides={**others, key: needed}) is not None


def test_the_frame_is_at_most_a_wal_record() -> None:
    """A reliable topic writes a message as one WAL record, at most 64 MiB: a larger frame
    would let a message through that the WAL cannot hold."""
    edge = {"limits.frame_bytes_max": 64 * MIB, "limits.inbound_bytes_per_connection_max": 64 * MIB + 1,
            "limits.inbound_bytes_max": 256 * MIB}
    assert load_config(env={}, overrides=edge).limits.frame_bytes_max == 64 * MIB
    message = load_error(overrides={**edge, "limits.frame_bytes_max": 64 * MIB + 1})
    assert message.startswith("config key 'limits.frame_bytes_max': must be between 1 and 67108864 (64 MiB, the"
                              " largest WAL record)"), message


def test_the_limits_raised_for_a_20_mb_message_are_the_documented_ones() -> None:
    """docs/operations.md's recipe for 20 MB messages loads as written."""
    text = ROOT.joinpath("docs", "operations.md").read_text()
    recipe = text[text.index("<!-- large-messages-recipe -->"):]
    env = dict(line.split("=", 1) for line in recipe.split("```")[1].split() if line.startswith("DANUBE_"))
    config = load_config(env=env)
    assert config.policies.max_message_size >= 20_000_000


def test_curve_mode_requires_the_broker_keys(tmp_path: Path) -> None:
    """security.mode curve without the broker's key pair or the cluster's public keys is refused
    at load, naming the missing key; the default mode needs neither."""
    assert load_config(None).security.mode == "none"
    with pytest.raises(ConfigError, match=r"security.broker_key_file.*required with security.mode curve"):
        load_config(write(tmp_path, "security:\n  mode: curve\n"))
    text = "security:\n  mode: curve\n  broker_key_file: b.key_secret\n"
    with pytest.raises(ConfigError, match=r"security.broker_public_keys_dir"):
        load_config(write(tmp_path, text))
    config = load_config(write(tmp_path, text + "  broker_public_keys_dir: keys\n  super_admins: [ops]\n"))
    assert config.security.mode == "curve" and config.security.super_admins == ("ops",)


def test_security_refuses_unknown_modes_and_mismatched_jwt_keys(tmp_path: Path) -> None:
    """A misspelt mode, an unknown algorithm, or a token key of the wrong kind for the algorithm
    is a ConfigError naming the key."""
    with pytest.raises(ConfigError, match=r"security.mode.*none, curve"):
        load_config(write(tmp_path, "security:\n  mode: tls\n"))
    with pytest.raises(ConfigError, match=r"security.jwt_algorithm"):
        load_config(write(tmp_path, "security:\n  jwt_algorithm: none\n"))
    with pytest.raises(ConfigError, match=r"security.jwt_public_key_file.*HS256 takes jwt_secret_file"):
        load_config(write(tmp_path, "security:\n  jwt_public_key_file: pub.pem\n"))
    with pytest.raises(ConfigError, match=r"security.jwt_secret_file.*RS256 takes jwt_public_key_file"):
        load_config(write(tmp_path, "security:\n  jwt_algorithm: RS256\n  jwt_secret_file: s\n"))


def test_metrics_endpoint_is_loopback_by_default_and_its_security_is_checked(tmp_path: Path) -> None:
    """broker.metrics_host defaults to 127.0.0.1; metrics_connections_max and jwt_token_bytes_max
    are range-checked; a TLS certificate without its key (or the reverse) is refused at load,
    naming both keys; env overrides reach the new fields."""
    config = load_config(None)
    assert config.broker.metrics_host == "127.0.0.1" and config.broker.metrics_connections_max == 16
    assert config.security.metrics_tls_cert_file is None and config.security.metrics_basic_auth_file is None
    assert config.security.jwt_token_bytes_max == 8192
    with pytest.raises(ConfigError, match=r"broker.metrics_host.*must be an address"):
        load_config(write(tmp_path, "broker:\n  metrics_host: ''\n"))
    with pytest.raises(ConfigError, match=r"broker.metrics_connections_max"):
        load_config(write(tmp_path, "broker:\n  metrics_connections_max: 0\n"))
    with pytest.raises(ConfigError, match=r"security.jwt_token_bytes_max"):
        load_config(write(tmp_path, "security:\n  jwt_token_bytes_max: 100\n"))
    with pytest.raises(ConfigError, match=r"security.metrics_tls_key_file.*metrics_tls_cert_file go together"):
        load_config(write(tmp_path, "security:\n  metrics_tls_cert_file: cert.pem\n"))
    with pytest.raises(ConfigError, match=r"security.metrics_tls_key_file"):
        load_config(write(tmp_path, "security:\n  metrics_tls_key_file: key.pem\n"))
    config = load_config(None, env={"DANUBE_BROKER__METRICS_HOST": "0.0.0.0",
                                    "DANUBE_SECURITY__METRICS_TLS_CERT_FILE": "c.pem",
                                    "DANUBE_SECURITY__METRICS_TLS_KEY_FILE": "k.pem",
                                    "DANUBE_SECURITY__METRICS_BASIC_AUTH_FILE": "passwd"})
    assert config.broker.metrics_host == "0.0.0.0"
    assert (config.security.metrics_tls_cert_file, config.security.metrics_tls_key_file,
            config.security.metrics_basic_auth_file) == ("c.pem", "k.pem", "passwd")


def test_broker_io_threads_defaults_to_one_and_is_range_checked(tmp_path: Path) -> None:
    """broker.io_threads (libzmq's I/O threads of the broker's context) is 1 by default,
    read from the file and the environment, and refused outside 1..16 naming the key."""
    assert load_config(None).broker.io_threads == 1
    assert load_config(write(tmp_path, "broker:\n  io_threads: 2\n")).broker.io_threads == 2
    assert load_config(None, env={"DANUBE_BROKER__IO_THREADS": "3"}).broker.io_threads == 3
    for bad in ("0", "17"):
        with pytest.raises(ConfigError, match=r"broker.io_threads"):
            load_config(write(tmp_path, f"broker:\n  io_threads: {bad}\n"))


def test_metrics_topics_max_is_range_checked(tmp_path: Path) -> None:
    """broker.metrics_topics_max defaults to 1,000; below 0 or above 1,000,000 the load
    fails naming the key; 0 (every topic under _other) is allowed."""
    assert load_config(None).broker.metrics_topics_max == 1_000
    assert load_config(write(tmp_path, "broker:\n  metrics_topics_max: 0\n")).broker.metrics_topics_max == 0
    for bad in (-1, 1_000_001):
        with pytest.raises(ConfigError, match=r"broker.metrics_topics_max.*between 0 and 1000000"):
            load_config(write(tmp_path, f"broker:\n  metrics_topics_max: {bad}\n"))


def test_grpc_door_is_off_by_default() -> None:
    """No broker.grpc_listen unless asked: a broker binds no gRPC port by default."""
    broker = load_config(env={}).broker
    assert (broker.grpc_listen, broker.grpc_advertised_url, broker.grpc_attachments_max) == (None, None, 1_000)
    assert broker.grpc_admin_listen is None


@pytest.mark.parametrize("endpoint", ["127.0.0.1:6651", "tcp://127.0.0.1:6651", "http://127.0.0.1",
                                      "http://:6651", "http://127.0.0.1:99999", "http://h/x:1"])
def test_bad_grpc_endpoints(endpoint: str) -> None:
    """The gRPC door's addresses are http://HOST:PORT, as Danube's clients are given them."""
    for key in ("broker.grpc_listen", "broker.grpc_admin_listen"):
        message = load_error(overrides={key: endpoint})
        assert message.startswith(f"config key {key!r}: expected http://HOST:PORT"), message
    message = load_error(overrides={"broker.grpc_advertised_url": endpoint})
    assert message.startswith("config key 'broker.grpc_advertised_url': expected http|https://HOST:PORT"), message


def test_grpc_advertised_url_may_say_https() -> None:
    """A door serving TLS is advertised as https:// (Danube's tools pick TLS from the
    scheme they are told); it binds http://HOST:PORT all the same."""
    overrides = {"broker.grpc_listen": "http://0.0.0.0:6651", "broker.grpc_advertised_url": "https://b1.example:6651"}
    assert load_config(env={}, overrides=overrides).broker.grpc_advertised_url == "https://b1.example:6651"
    message = load_error(overrides={**overrides, "broker.grpc_listen": "https://0.0.0.0:6651"})
    assert message.startswith("config key 'broker.grpc_listen': expected http://HOST:PORT"), message


@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:0", "http://0.0.0.0:6651", "http://[::1]:6651"])
def test_good_grpc_endpoints(endpoint: str) -> None:
    assert load_config(env={}, overrides={"broker.grpc_listen": endpoint}).broker.grpc_listen == endpoint


@pytest.mark.parametrize("door", ["broker.grpc_listen", "broker.grpc_admin_listen"])
def test_grpc_doors_need_tls_with_curve(tmp_path: Path, door: str) -> None:
    """A door's callers send their bearer token in every call: with security.mode curve
    the config refuses a door that would take it in clear, and names what to set."""
    curve = {door: "http://127.0.0.1:0", "security.mode": "curve",
             "security.broker_key_file": str(tmp_path / "k"), "security.broker_public_keys_dir": str(tmp_path)}
    message = load_error(overrides=curve)
    assert message.startswith(f"config key {door!r}: needs TLS with security.mode curve: set"
                              " security.grpc_tls_cert_file and security.grpc_tls_key_file"), message
    tls = {"security.grpc_tls_cert_file": str(tmp_path / "door.crt"),
           "security.grpc_tls_key_file": str(tmp_path / "door.key")}
    config = load_config(env={}, overrides={**curve, **tls})
    assert config.security.grpc_tls_cert_file == str(tmp_path / "door.crt")


def test_grpc_tls_files_go_together(tmp_path: Path) -> None:
    message = load_error(overrides={"security.grpc_tls_cert_file": str(tmp_path / "door.crt")})
    assert message.startswith("config key 'security.grpc_tls_key_file': and security.grpc_tls_cert_file go"
                              " together"), message


def test_grpc_client_ca_needs_the_doors_tls(tmp_path: Path) -> None:
    """Mutual TLS asks for the client's certificate within a TLS handshake: a client CA
    without the doors' own certificate is refused, naming what to set."""
    ca = {"security.grpc_tls_client_ca_file": str(tmp_path / "clients-ca.pem")}
    message = load_error(overrides=ca)
    assert message.startswith("config key 'security.grpc_tls_client_ca_file': needs security.grpc_tls_cert_file"
                              " and security.grpc_tls_key_file (mutual TLS is TLS first)"), message
    config = load_config(env={}, overrides={**ca, "security.grpc_tls_cert_file": str(tmp_path / "door.crt"),
                                            "security.grpc_tls_key_file": str(tmp_path / "door.key")})
    assert config.security.grpc_tls_client_ca_file == str(tmp_path / "clients-ca.pem")


def test_grpc_doors_need_two_ports() -> None:
    message = load_error(overrides={"broker.grpc_listen": "http://127.0.0.1:6651",
                                    "broker.grpc_admin_listen": "http://127.0.0.1:6651"})
    assert message.startswith("config key 'broker.grpc_admin_listen': must differ from broker.grpc_listen"), message
    both_free = load_config(env={}, overrides={"broker.grpc_listen": "http://127.0.0.1:0",
                                               "broker.grpc_admin_listen": "http://127.0.0.1:0"})
    assert both_free.broker.grpc_admin_listen == "http://127.0.0.1:0"

"""ZAP credentials (which key may finish a handshake on which port, who a key is) and
how a client's CURVE is taken from its arguments or the environment."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq

from danube_zmq.security.curve import ZAP_ADMIN, ZAP_CLIENT, ZAP_RAFT, Credentials, client_curve
from danube_zmq.security.keys import KeyPair, generate_key_pair
from danube_zmq.security.rbac import Principal, PrincipalType
from danube_zmq.transport.errors import InvalidArgument


def _key() -> bytes:
    return zmq.curve_keypair()[0]


def test_raft_admits_only_broker_keys_and_client_ports_admit_any() -> None:
    """The raft domain admits a broker key and refuses another; client and admin admit any
    key; an unknown domain is refused; each outcome is counted per domain."""
    broker, stranger = _key(), _key()
    credentials = Credentials({broker: "cluster"})
    assert credentials.callback(ZAP_RAFT, broker)
    assert not credentials.callback(ZAP_RAFT, stranger)
    assert credentials.callback(ZAP_CLIENT, stranger) and credentials.callback(ZAP_ADMIN, stranger)
    assert not credentials.callback("other", broker)
    stats = credentials.statistics()
    assert stats.admitted == {ZAP_CLIENT: 1, ZAP_ADMIN: 1, ZAP_RAFT: 1}
    assert stats.refused == {ZAP_CLIENT: 0, ZAP_ADMIN: 0, ZAP_RAFT: 1}


def test_broker_keys_can_rotate_without_a_restart() -> None:
    """replace_broker_keys swaps the raft allow-list in place: the next key is admitted,
    the retired one refused."""
    old, new = _key(), _key()
    credentials = Credentials({old: "cluster"})
    credentials.replace_broker_keys({new: "next"})
    assert credentials.callback(ZAP_RAFT, new) and not credentials.callback(ZAP_RAFT, old)
    assert credentials.is_broker_key(new.decode()) and not credentials.is_broker_key(old)


def test_an_allow_list_can_never_make_a_client_a_broker() -> None:
    """A listed client key is its principal; an entry of type broker, or one naming a
    broker key, is left out: broker keys alone are brokers."""
    broker, alice, mallory = _key(), _key(), _key()
    credentials = Credentials({broker: "cluster"})
    credentials.replace_client_keys({alice.decode(): Principal(name="alice", type=PrincipalType.USER),
                                     mallory: Principal(name="mallory", type=PrincipalType.BROKER),
                                     broker: Principal(name="eve", type=PrincipalType.SERVICE_ACCOUNT)})
    assert credentials.principal_of_key(alice) == Principal(name="alice", type=PrincipalType.USER)
    assert credentials.principal_of_key(mallory) is None
    assert credentials.principal_of_key(broker) == Principal(name="broker", type=PrincipalType.BROKER)
    assert credentials.statistics().client_keys == 1


def test_client_curve_from_arguments_files_and_environment(tmp_path: Path) -> None:
    """No server key: plaintext. A server key alone: a fresh client pair. Files and
    (public, secret) pairs load; the environment fills what the arguments leave out."""
    server = generate_key_pair(tmp_path, "cluster")
    alice = generate_key_pair(tmp_path, "alice")
    assert client_curve(env={}) is None
    fresh = client_curve(server.public_key)
    assert fresh is not None and fresh.server_public_key == server.public_key.encode()
    assert zmq.curve_public(fresh.keys.secret) == fresh.keys.public
    from_files = client_curve(str(server.public_file), str(alice.secret_file))
    assert from_files is not None and from_files.keys.public == alice.public_key.encode()
    public, secret = zmq.curve_keypair()
    paired = client_curve(server.public_key.encode(), (public.decode(), secret))
    assert paired is not None and paired.keys == KeyPair(public=public, secret=secret)
    env = {"DANUBE_SERVER_KEY": str(server.public_file), "DANUBE_CLIENT_KEYS": str(alice.secret_file)}
    from_env = client_curve(env=env)
    assert from_env is not None and from_env.keys.public == alice.public_key.encode()


def test_client_curve_refuses_inconsistent_keys(tmp_path: Path) -> None:
    """Client keys without a server key, a pair whose halves do not match, and a server
    key that is not Z85 are InvalidArgument."""
    server = generate_key_pair(tmp_path, "cluster")
    with pytest.raises(InvalidArgument, match="need the broker's server_public_key"):
        client_curve(None, (_key(), zmq.curve_keypair()[1]))
    with pytest.raises(InvalidArgument, match="not the secret key's"):
        client_curve(server.public_key, (_key(), zmq.curve_keypair()[1]))
    with pytest.raises(InvalidArgument, match="not a CURVE key"):
        client_curve(b"too short")

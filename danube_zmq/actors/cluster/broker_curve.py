"""A broker's CURVE material, loaded once at start from `security.*` (mode curve).

The cluster key pair (`broker_key_file`) serves every listener and is every dialer's
client pair; the broker keys (`broker_public_keys_dir`) are the only keys ZAP admits on
the Raft port, and the keys that are `broker` principals. A missing or malformed file
is a `ConfigError` naming the config key and the path, before any socket binds.
"""

from __future__ import annotations

from typing import Any

from danube_zmq.config.broker_config import SecuritySection
from danube_zmq.security.curve import ClusterCurve, Credentials
from danube_zmq.security.keys import load_key_pair, load_public_keys
from danube_zmq.transport.errors import ConfigError, InvalidArgument

__all__ = ["admin_client_curve", "load_cluster_curve"]


def load_cluster_curve(section: SecuritySection) -> tuple[ClusterCurve, Credentials] | None:
    """The cluster's CURVE and the ZAP credentials; None in mode none."""
    if section.mode != "curve":
        return None
    assert section.broker_key_file is not None and section.broker_public_keys_dir is not None  # checked at load
    try:
        keys = load_key_pair(section.broker_key_file)
    except InvalidArgument as exc:
        raise ConfigError(f"config key 'security.broker_key_file': {exc.message}") from None
    try:
        broker_keys = load_public_keys(section.broker_public_keys_dir)
    except InvalidArgument as exc:
        raise ConfigError(f"config key 'security.broker_public_keys_dir': {exc.message}") from None
    if keys.public not in broker_keys:
        # The brokers dial each other's Raft port with this pair: ZAP would refuse them all.
        raise ConfigError(f"config key 'security.broker_public_keys_dir': {section.broker_public_keys_dir} does not"
                          f" hold the public key of security.broker_key_file ({keys.public.decode()}); copy its"
                          " .key file there")
    return ClusterCurve(keys=keys), Credentials(broker_keys)


def admin_client_curve(curve: ClusterCurve | None) -> dict[str, Any]:
    """The CURVE arguments of an `AdminClient` this broker opens to another broker: the
    cluster pair in mode curve, plaintext in mode none; never the process's environment
    (DANUBE_SERVER_KEY is for clients, the broker's sockets follow its config alone)."""
    if curve is None:
        return {"use_env": False}
    client = curve.client
    return {"server_public_key": client.server_public_key, "client_keys": client.keys, "use_env": False}

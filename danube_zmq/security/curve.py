"""CurveZMQ on a broker's sockets: the options, the ZAP handler, and who a key is.

    client / admin / raft dialer --CURVE handshake--> broker ROUTER (curve_server, zap_domain)
                                                          |  ZAP request (domain, key)
                                                          v
                                   ZapService (inproc://zeromq.zap.01, on the broker's loop)
                                                          |  Credentials.callback(domain, key)
                                                          v
                            200 + User-Id = the key (Z85): every frame of that connection carries it

1. Every listener of a broker in mode curve serves with the CLUSTER key pair (the same
   `security.broker_key_file` on every broker), so a client knows one server key for
   every broker it is redirected to; every dialer of a broker dials with that pair too.
2. ZAP domains: `client` and `admin` admit any key (who it is is decided after the
   handshake: a token in `Connect`, the client-key allow-list, or a broker key); `raft`
   admits only the keys of `broker_public_keys_dir`. A refused key never gets a socket.
3. The broker reads the key of each message from its frame (`frame.get("User-Id")`),
   never from the payload, and asks `Credentials.principal_of_key` who it is.

The ZAP handler is pyzmq's asyncio one, on the broker's own loop: a handshake costs one
REP round there (once per connection, never per message), and the credentials are read
and replaced on that one loop, so the allow-list changes without a lock or a restart.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.auth.asyncio import AsyncioAuthenticator

from danube_zmq.security.keys import KeyPair, load_key_pair, load_public_key, public_key_from_text
from danube_zmq.security.rbac import Principal, PrincipalType
from danube_zmq.transport.errors import InvalidArgument

__all__ = [
    "ZAP_ADMIN",
    "ZAP_CLIENT",
    "ZAP_DOMAINS",
    "ZAP_RAFT",
    "ClientCurve",
    "ClusterCurve",
    "Credentials",
    "CredentialsStatistics",
    "ZapService",
    "client_curve",
    "key_of_frame",
]

log = logging.getLogger("danube_zmq.security")

ZAP_CLIENT = "client"
ZAP_ADMIN = "admin"
ZAP_RAFT = "raft"
ZAP_DOMAINS = (ZAP_CLIENT, ZAP_ADMIN, ZAP_RAFT)
_ANY_KEY_DOMAINS = frozenset((ZAP_CLIENT, ZAP_ADMIN))
ENV_SERVER_KEY = "DANUBE_SERVER_KEY"  # the broker's public key: a .key file or its Z85 text
ENV_CLIENT_KEYS = "DANUBE_CLIENT_KEYS"  # the client's .key_secret file

ServerKey = str | bytes | os.PathLike[str]
ClientKeys = str | os.PathLike[str] | tuple[str | bytes, str | bytes] | KeyPair


@dataclass(frozen=True, slots=True)
class ClientCurve:
    """What a dialer needs: the server's public key and its own key pair (Z85)."""

    server_public_key: bytes
    keys: KeyPair

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Make `sock` a CURVE client; before `connect`."""
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_public_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.keys.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.keys.secret)


def client_curve(server_public_key: ServerKey | None = None, client_keys: ClientKeys | None = None, *,
                 env: Mapping[str, str] | None = None) -> ClientCurve | None:
    """A client's CURVE, or None (plaintext) without a server key. Each argument left None
    is taken from `env` (DANUBE_SERVER_KEY, DANUBE_CLIENT_KEYS) when given. The server key:
    Z85 text or bytes, or a `.key` file; the client keys: a `.key_secret` file or a
    (public, secret) Z85 pair; none: a fresh pair for this client (`zmq.curve_keypair`),
    enough when the principal comes from a token."""
    if env is not None:
        server_public_key = server_public_key if server_public_key is not None else env.get(ENV_SERVER_KEY) or None
        client_keys = client_keys if client_keys is not None else env.get(ENV_CLIENT_KEYS) or None
    if server_public_key is None:
        if client_keys is not None:
            raise InvalidArgument("client_keys (DANUBE_CLIENT_KEYS) need the broker's server_public_key"
                                  " (DANUBE_SERVER_KEY): CURVE authenticates both ends")
        return None
    if isinstance(server_public_key, bytes):
        server = public_key_from_text(server_public_key.decode("ascii", "replace"))
    else:
        server = load_public_key(server_public_key)
    return ClientCurve(server_public_key=server, keys=_client_pair(client_keys))


def _client_pair(client_keys: ClientKeys | None) -> KeyPair:
    if client_keys is None:
        public, secret = zmq.curve_keypair()
        return KeyPair(public=public, secret=secret)
    if isinstance(client_keys, KeyPair):
        return client_keys
    if isinstance(client_keys, tuple):
        if len(client_keys) != 2:
            raise InvalidArgument("client_keys: give a .key_secret file or a (public, secret) pair of Z85 keys")
        public, secret = (public_key_from_text(k.decode("ascii", "replace") if isinstance(k, bytes) else k)
                          for k in client_keys)
        if zmq.curve_public(secret) != public:
            raise InvalidArgument("client_keys: the public key is not the secret key's")
        return KeyPair(public=public, secret=secret)
    return load_key_pair(client_keys)


@dataclass(frozen=True, slots=True)
class ClusterCurve:
    """A broker's CURVE: the cluster key pair, served by its listeners and dialed with by
    its own clients (Raft DEALERs, admin clients of other brokers)."""

    keys: KeyPair

    def serve(self, sock: zmq.Socket[Any], domain: str) -> None:
        """Make `sock` a CURVE server whose peers ZAP checks in `domain`; before `bind`."""
        assert domain in ZAP_DOMAINS, domain
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.keys.secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.keys.public)
        sock.setsockopt(zmq.ZAP_DOMAIN, domain.encode())

    @property
    def client(self) -> ClientCurve:
        return ClientCurve(server_public_key=self.keys.public, keys=self.keys)

    def dial(self, sock: zmq.Socket[Any]) -> None:
        self.client.apply(sock)


@dataclass(frozen=True, slots=True)
class CredentialsStatistics:
    admitted: dict[str, int]  # ZAP domain -> handshakes admitted
    refused: dict[str, int]  # ZAP domain -> handshakes refused
    broker_keys: int
    client_keys: int


class Credentials:
    """The ZAP credentials provider (`configure_curve_callback`) and the key -> principal
    map. Keys are Z85 bytes. Replaced whole (`replace_*`) when the files or the metadata
    store's allow-list change; read on the broker's loop only."""

    def __init__(self, broker_keys: Mapping[bytes, str]) -> None:
        self._broker_keys: frozenset[bytes] = frozenset(broker_keys)
        self._client_keys: dict[bytes, Principal] = {}
        self._admitted = dict.fromkeys(ZAP_DOMAINS, 0)
        self._refused = dict.fromkeys(ZAP_DOMAINS, 0)

    def callback(self, domain: str, key: bytes) -> bool:
        """ZAP's question: may the peer holding `key` finish its handshake in `domain`?"""
        if domain in _ANY_KEY_DOMAINS:
            allowed = True
        elif domain == ZAP_RAFT:
            allowed = key in self._broker_keys
        else:  # a socket of ours with a domain we do not know: a bug, refused
            log.error("ZAP request for unknown domain %r refused", domain)
            return False
        (self._admitted if allowed else self._refused)[domain] += 1
        if not allowed:
            log.warning("CURVE key %s refused on the %s port: not a broker key", key.decode("ascii", "replace"),
                        domain)
        return allowed

    def is_broker_key(self, key: bytes | str) -> bool:
        return _z85(key) in self._broker_keys

    def principal_of_key(self, key: bytes | str) -> Principal | None:
        """Who an authenticated key is: a broker, a client key on the allow-list, or
        nobody known (None: the session must bring a token)."""
        z85 = _z85(key)
        if z85 in self._broker_keys:  # first: an allow-list entry can never make a broker key a client
            return Principal(name="broker", type=PrincipalType.BROKER)
        return self._client_keys.get(z85)

    def replace_broker_keys(self, keys: Mapping[bytes, str]) -> None:
        self._broker_keys = frozenset(keys)

    def replace_client_keys(self, mapping: Mapping[bytes | str, Principal]) -> None:
        """The client-key allow-list, whole: key (Z85) -> its principal. A key of type
        `broker` or one that is a broker key is left out: only broker keys are brokers."""
        keys: dict[bytes, Principal] = {}
        for key, principal in mapping.items():
            z85 = _z85(key)
            if principal.type == PrincipalType.BROKER or z85 in self._broker_keys:
                log.warning("client key %s (%s) left out of the allow-list: only broker keys act as brokers",
                            z85.decode("ascii", "replace"), principal.name)
                continue
            keys[z85] = principal
        self._client_keys = keys

    def statistics(self) -> CredentialsStatistics:
        return CredentialsStatistics(admitted=dict(self._admitted), refused=dict(self._refused),
                                     broker_keys=len(self._broker_keys), client_keys=len(self._client_keys))


class ZapService:
    """The one ZAP handler of a broker's zmq context: started before any socket binds
    (a CURVE server without a handler would admit every key), stopped at broker stop."""

    def __init__(self, context: zmq.Context[Any], credentials: Credentials) -> None:
        self.context = context
        self.credentials = credentials
        self._authenticator: AsyncioAuthenticator | None = None

    def start(self) -> None:
        """Bind the ZAP socket and serve it on the running loop."""
        assert self._authenticator is None
        authenticator = AsyncioAuthenticator(self.context, log=logging.getLogger("danube_zmq.security.zap"))
        authenticator.start()
        for domain in ZAP_DOMAINS:  # pyzmq looks a domain up exactly: "*" would not match "client"
            authenticator.configure_curve_callback(domain, self.credentials)
        self._authenticator = authenticator

    def stop(self) -> None:
        if self._authenticator is not None:
            self._authenticator.stop()
            self._authenticator = None


def key_of_frame(frame: zmq.Frame) -> bytes | None:
    """The Z85 key ZAP authenticated for the connection `frame` came on (its `User-Id`),
    None on a connection without one (mode none, inproc)."""
    try:
        user_id = frame.get("User-Id")
    except zmq.ZMQError:  # no such property on this frame
        return None
    return user_id.encode("ascii") if isinstance(user_id, str) else user_id


def _z85(key: bytes | str) -> bytes:
    return key.encode("ascii") if isinstance(key, str) else key

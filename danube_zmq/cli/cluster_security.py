"""The security material of a local secured cluster (`danube cluster up --security-dir DIR`).

One directory holds what a cluster in `security.mode: curve` with HS256 tokens needs,
made on the first `up` and reused by the next ones (a key or secret is never replaced):

    DIR/cluster.key, DIR/cluster.key_secret   the cluster key pair (every broker's broker_key_file)
    DIR/broker-keys/cluster.key                security.broker_public_keys_dir (the broker keys)
    DIR/jwt.secret                             the HS256 secret (security.jwt_secret_file), mode 0600
    DIR/admin.jwt                              a token of the super admin `admin`, minted at each `up`

The cluster's own commands (`up` waiting for the leader, `status`) use a short token of
their own minted from the secret, so they work whatever became of `admin.jwt`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from danube_zmq.security.keys import PUBLIC_SUFFIX, SECRET_SUFFIX, generate_key_pair, load_key_pair
from danube_zmq.security.token_keys import new_secret, read_secret, write_new_file
from danube_zmq.security.tokens import TokenSigner

ADMIN_SUBJECT = "admin"
_CLUSTER_KEY = "cluster"
_TOOL_TOKEN_TTL_S = 600  # the command's own calls: minutes at most


@dataclass(frozen=True)
class ClusterSecurity:
    directory: Path
    # The brokers' security.jwt_issuer and jwt_audience: what their tokens must say.
    issuer: str = "danube"
    audience: str = "danube"

    @property
    def cluster_secret_file(self) -> Path:
        return self.directory / f"{_CLUSTER_KEY}{SECRET_SUFFIX}"

    @property
    def broker_keys_dir(self) -> Path:
        return self.directory / "broker-keys"

    @property
    def server_key_file(self) -> Path:
        """The cluster's public key, which clients give as DANUBE_SERVER_KEY."""
        return self.broker_keys_dir / f"{_CLUSTER_KEY}{PUBLIC_SUFFIX}"

    @property
    def jwt_secret_file(self) -> Path:
        return self.directory / "jwt.secret"

    @property
    def admin_token_file(self) -> Path:
        return self.directory / "admin.jwt"

    def broker_env(self, super_admins: list[str]) -> dict[str, str]:
        """The security section of every broker, as environment overrides of its config."""
        admins = list(dict.fromkeys([*super_admins, ADMIN_SUBJECT]))
        return {"DANUBE_SECURITY__MODE": "curve",
                "DANUBE_SECURITY__BROKER_KEY_FILE": str(self.cluster_secret_file),
                "DANUBE_SECURITY__BROKER_PUBLIC_KEYS_DIR": str(self.broker_keys_dir),
                "DANUBE_SECURITY__JWT_ALGORITHM": "HS256",
                "DANUBE_SECURITY__JWT_SECRET_FILE": str(self.jwt_secret_file),
                "DANUBE_SECURITY__SUPER_ADMINS": ",".join(admins)}

    def mint(self, ttl_s: int) -> str:
        """A token of the super admin, valid `ttl_s` seconds."""
        signer = TokenSigner("HS256", read_secret(self.jwt_secret_file, "jwt_secret_file"), issuer=self.issuer,
                             audience=self.audience, now_s=time.time)
        return signer.create(ADMIN_SUBJECT, "user", ttl_s)

    def admin_client_options(self) -> dict[str, Any]:
        """AdminClient arguments for the cluster command's own calls: CURVE with the
        cluster's public key, a fresh client pair, a short admin token, no environment."""
        return {"server_public_key": str(self.server_key_file), "token": self.mint(_TOOL_TOKEN_TTL_S),
                "use_env": False}

    def describe(self) -> dict[str, str]:
        """What `cluster.json` keeps (`from_description` reads it back)."""
        return {"dir": str(self.directory), "server_key_file": str(self.server_key_file),
                "admin_token_file": str(self.admin_token_file), "admin_subject": ADMIN_SUBJECT,
                "jwt_secret_file": str(self.jwt_secret_file), "issuer": self.issuer, "audience": self.audience}

    @classmethod
    def from_description(cls, described: dict[str, str]) -> ClusterSecurity:
        return cls(Path(described["dir"]), issuer=described["issuer"], audience=described["audience"])


def prepare(directory: Path, *, admin_token_ttl_s: int, issuer: str = "danube",
            audience: str = "danube") -> ClusterSecurity:
    """Make what is missing in `directory` (keys, secret), check what is there (a bad
    key file is InvalidArgument naming it), and mint a new `admin.jwt`."""
    security = ClusterSecurity(directory.resolve(), issuer=issuer, audience=audience)
    security.directory.mkdir(parents=True, exist_ok=True)
    os.chmod(security.directory, 0o700)
    if not security.cluster_secret_file.exists():
        generate_key_pair(security.directory, _CLUSTER_KEY)
    load_key_pair(security.cluster_secret_file)  # a damaged pair refused before any broker starts
    if not security.server_key_file.exists():
        security.broker_keys_dir.mkdir(exist_ok=True)
        shutil.copyfile(security.directory / f"{_CLUSTER_KEY}{PUBLIC_SUFFIX}", security.server_key_file)
    if not security.jwt_secret_file.exists():
        write_new_file(security.jwt_secret_file, new_secret(), 0o600)
    _replace(security.admin_token_file, security.mint(admin_token_ttl_s).encode() + b"\n")
    return security


def _replace(path: Path, data: bytes) -> None:
    """Write `path` (mode 0600) whole or not at all: a reader never sees half a token."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise

"""`danube security keys`: CURVE key pairs for brokers and clients (docs/security.md).

`generate --out DIR [--name NAME]` writes NAME.key (public) and NAME.key_secret (secret,
mode 0600) as `zmq.auth.create_certificates` does, never over an existing file. The
cluster's key pair goes to every broker (`security.broker_key_file`) and its `.key` to
`security.broker_public_keys_dir`; a client's `.key_secret` is its `--client-keys`.
"""

from __future__ import annotations

import click

from danube_zmq.cli.output import emit_json, emit_line, status
from danube_zmq.security.keys import generate_key_pair


@click.group()
def keys() -> None:
    """CURVE key pairs (Z85 files) for brokers and clients."""


@keys.command()
@click.option("--out", "out_dir", required=True, metavar="DIR", type=click.Path(file_okay=False),
              help="Directory for NAME.key and NAME.key_secret (created if missing).")
@click.option("--name", default="danube", show_default=True, metavar="NAME", help="File name of the pair.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def generate(out_dir: str, name: str, as_json: bool) -> None:
    """Write a new key pair; print its public key (Z85) and the two files."""
    generated = generate_key_pair(out_dir, name)
    if as_json:
        emit_json({"public_key": generated.public_key, "public_file": str(generated.public_file),
                   "secret_file": str(generated.secret_file)})
        return
    emit_line(generated.public_key)
    status(f"public key: {generated.public_file}")
    status(f"secret key: {generated.secret_file} (mode 0600: keep it private)")

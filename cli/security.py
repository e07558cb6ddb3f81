"""`danube security`: CURVE keys, JWT tokens, roles and bindings (docs/security.md).

Each family of commands lives in its own module and is added to this group below.
"""

from __future__ import annotations

import click


@click.group()
def security() -> None:
    """Keys, tokens, roles and bindings of a secured cluster (security.mode curve)."""


from danube_zmq.cli.security_keys import keys  # noqa: E402  (each family registers here, after the group)

security.add_command(keys)

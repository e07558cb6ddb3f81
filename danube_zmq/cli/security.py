"""`danube security`: CURVE keys, JWT tokens, roles and bindings (docs/security.md).

Each family of commands lives in its own module and is added to this group below.
"""

from __future__ import annotations

import click


@click.group()
def security() -> None:
    """Keys, tokens, roles and bindings of a secured cluster (security.mode curve)."""


from danube_zmq.cli.security_keys import keys  # noqa: E402  (each family registers itself below the group)
from danube_zmq.cli.security_metrics import metrics  # noqa: E402
from danube_zmq.cli.security_rbac import bindings, client_keys, revocations, roles  # noqa: E402
from danube_zmq.cli.security_tokens import tokens  # noqa: E402

for _family in (keys, tokens, roles, bindings, revocations, client_keys, metrics):
    security.add_command(_family)

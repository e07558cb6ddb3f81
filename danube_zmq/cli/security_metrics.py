"""`danube security metrics password`: a line of the metrics endpoint's basic auth file.

    danube security metrics password --user prometheus >> metrics.passwd

The password is asked twice on the terminal (or read from stdin with --password-stdin)
and never printed; the line holds a salted PBKDF2-SHA256 hash (security/basic_auth.py).
"""

from __future__ import annotations

import sys

import click

from danube_zmq.cli.output import emit_line
from danube_zmq.security.basic_auth import ITERATIONS_DEFAULT, ITERATIONS_MAX, ITERATIONS_MIN, hash_password

__all__ = ["metrics"]


@click.group()
def metrics() -> None:
    """The metrics endpoint's basic auth (security.metrics_basic_auth_file)."""


@metrics.command()
@click.option("--user", required=True, help="The user name Prometheus sends (basic_auth.username).")
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin instead of asking.")
@click.option("--iterations", type=click.IntRange(ITERATIONS_MIN, ITERATIONS_MAX), default=ITERATIONS_DEFAULT,
              show_default=True, help="PBKDF2 rounds: each failed login costs the broker this many.")
def password(user: str, password_stdin: bool, iterations: int) -> None:
    """Print `USER:pbkdf2_sha256$...` for a password file.

    \b
    Example:
      danube security metrics password --user prometheus >> metrics.passwd
    """
    if not user or ":" in user or any(c.isspace() for c in user):
        raise click.BadParameter("a user name has no ':' and no spaces", param_hint="--user")
    if password_stdin:
        secret = sys.stdin.readline().rstrip("\r\n")
    else:
        secret = click.prompt("password", hide_input=True, confirmation_prompt=True, err=True)
    if not secret:
        raise click.BadParameter("the password must not be empty", param_hint="--password-stdin")
    emit_line(f"{user}:{hash_password(secret, iterations=iterations)}")

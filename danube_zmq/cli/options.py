"""Options, parsers and async helpers shared by the `danube` command groups.

Input checks that concern one flag's *syntax* (`-a k1:v1,k2:v2`) are click usage
errors (exit 2, with the usage line). Checks of *names* (topics, namespaces)
raise `InvalidArgument`, as the broker would, and end as one `error:` line
(exit 1): the same message whether the CLI or the broker caught it.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from danube_zmq.transport.errors import InternalError, InvalidArgument, Unavailable
from danube_zmq.transport.topic_name import parse_topic

__all__ = [
    "DEFAULT_ADMIN_ENDPOINT",
    "DEFAULT_SERVICE_URL",
    "Interrupted",
    "StopSignals",
    "attributes_callback",
    "check_topic",
    "connect_timeout_option",
    "curve_options",
    "load_client",
    "parse_attributes",
    "partition_of",
    "service_url_option",
    "token_options",
    "within",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_SERVICE_URL = "tcp://127.0.0.1:6650"
DEFAULT_ADMIN_ENDPOINT = "tcp://127.0.0.1:50051"
DEFAULT_CONNECT_TIMEOUT_SECONDS = 5.0


# -- parsers -------------------------------------------------------------------


def parse_attributes(text: str) -> dict[str, str]:
    """Parse `k1:v1,k2:v2` into a dict; raise InvalidArgument naming the bad item.

    Keys and values are stripped of surrounding blanks. A value may itself hold
    ':' (`url:tcp://host:1` is key `url`); a key may not be empty or repeated.
    """
    attributes: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition(":")
        key, value = key.strip(), value.strip()
        if not item.strip():
            problem = "has an empty item"
        elif not sep:
            problem = f"item {item.strip()!r} has no ':'"
        elif not key:
            problem = f"item {item.strip()!r} has an empty key"
        elif key in attributes:
            problem = f"key {key!r} is given twice"
        else:
            attributes[key] = value
            continue
        raise InvalidArgument(f"attributes {text!r}: {problem} (expected k1:v1,k2:v2)")
    return attributes


def attributes_callback(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> dict[str, str] | None:
    if value is None:
        return None
    try:
        return parse_attributes(value)
    except InvalidArgument as err:
        raise click.BadParameter(str(err), ctx=ctx, param=param) from None


def check_topic(topic: str) -> str:
    """Return the topic's full name, or raise InvalidArgument saying what is wrong."""
    return parse_topic(topic).full


def partition_of(topic: str) -> int | None:
    """N for a partition topic `/ns/t-part-N`, None for anything else."""
    try:
        return parse_topic(topic).partition_index
    except InvalidArgument:
        return None


# -- shared options --------------------------------------------------------------


def service_url_option(command: F) -> F:
    command = curve_options(command)  # every command that dials a client port may need CURVE
    return click.option(
        "-s",
        "--service-url",
        "--service-addr",
        "service_url",
        envvar="DANUBE_SERVICE_URL",
        show_envvar=True,
        default=DEFAULT_SERVICE_URL,
        show_default=True,
        metavar="URL",
        help="Broker client endpoint.",
    )(command)


def _export_to_env(name: str) -> Callable[[click.Context, click.Parameter, str | None], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        # Into the environment, where every client reads it (DanubeClient, AdminClient,
        # SchemaRegistryClient): every client a command opens, in this process and in
        # the worker processes of `danube bench`, dials with the same keys.
        if value:
            os.environ[name] = value

    return callback


def curve_options(command: F) -> F:
    """--server-key and --client-keys (security.mode curve; docs/security.md), and the
    token options: every command that dials a broker may need both."""
    command = token_options(command)
    command = click.option(
        "--client-keys",
        envvar="DANUBE_CLIENT_KEYS",
        show_envvar=True,
        metavar="FILE",
        expose_value=False,
        callback=_export_to_env("DANUBE_CLIENT_KEYS"),
        help="This client's CURVE key pair (a .key_secret file); default: a fresh pair per run.",
    )(command)
    return click.option(
        "--server-key",
        envvar="DANUBE_SERVER_KEY",
        show_envvar=True,
        metavar="KEY|FILE",
        expose_value=False,
        callback=_export_to_env("DANUBE_SERVER_KEY"),
        help="The cluster's CURVE public key (Z85 or a .key file): connect over CURVE.",
    )(command)


def _token_to_env(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """--token or --token-file into DANUBE_TOKEN. A flag beats the environment (a file
    named on purpose wins over a DANUBE_TOKEN left in the shell); both flags is an error."""
    if not value:
        return
    from danube_zmq.rpc.tokens import ENV_TOKEN, read_token_file

    from_flag = ctx.get_parameter_source(param.name or "") == click.core.ParameterSource.COMMANDLINE
    rank = (2 if from_flag else 0) + (1 if param.name == "token_file" else 0)
    taken = ctx.meta.get("danube.token")
    if taken is not None:
        if from_flag and taken[1] >= 2:
            raise click.UsageError("give --token or --token-file, not both", ctx=ctx)
        if taken[1] > rank:
            return
    if param.name == "token_file":
        try:
            value = read_token_file(value)
        except InvalidArgument as err:
            raise click.BadParameter(str(err), ctx=ctx, param=param) from None
    ctx.meta["danube.token"] = (param.name, rank)
    os.environ[ENV_TOKEN] = value


def token_options(command: F) -> F:
    """--token and --token-file: the JWT every client of the command sends in its
    `Connect` (docs/security.md, "Clients"), through DANUBE_TOKEN like the keys."""
    command = click.option(
        "--token-file",
        "token_file",
        envvar="DANUBE_TOKEN_FILE",
        show_envvar=True,
        metavar="FILE",
        expose_value=False,
        callback=_token_to_env,
        help="Read the token from FILE, so that it is not on the command line.",
    )(command)
    return click.option(
        "--token",
        "token",
        envvar="DANUBE_TOKEN",
        show_envvar=True,
        metavar="JWT",
        expose_value=False,
        callback=_token_to_env,
        help="The JWT to connect with (`danube security tokens create`); `ps` shows it: prefer --token-file.",
    )(command)


def connect_timeout_option(command: F) -> F:
    return click.option(
        "--connect-timeout",
        "connect_timeout",
        envvar="DANUBE_CONNECT_TIMEOUT",
        show_envvar=True,
        type=click.FloatRange(min=0, min_open=True),
        default=DEFAULT_CONNECT_TIMEOUT_SECONDS,
        show_default=True,
        metavar="SECONDS",
        help="Give up when the broker does not answer within this time.",
    )(command)


# -- async helpers ---------------------------------------------------------------


def load_client() -> Any:
    """The `DanubeClient` class, imported only by the commands that talk to a broker."""
    try:
        from danube_zmq.client import DanubeClient
    except ImportError as err:
        raise InternalError(f"the danube_zmq client library is not available: {err}") from None
    return DanubeClient


async def within(awaitable: Awaitable[T], seconds: float, url: str) -> T:
    """Await `awaitable`, or raise Unavailable naming `url` after `seconds`."""
    try:
        async with asyncio.timeout(seconds):
            return await awaitable
    except TimeoutError:
        raise Unavailable(
            f"no answer from the broker at {url} within {seconds:g} s; is it running?"
        ) from None


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived while a command was waiting."""


class StopSignals:
    """SIGINT/SIGTERM set an event instead of raising KeyboardInterrupt mid-await.

    Used as `with StopSignals() as stop:` inside a running loop; `await
    stop.race(aw)` returns `aw`'s result or raises Interrupted when a signal comes
    first (cancelling `aw`). A second signal falls back to the default handler,
    so a stuck shutdown can still be interrupted.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.signal_name: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> StopSignals:
        self._loop = asyncio.get_running_loop()
        for sig in self.SIGNALS:
            self._loop.add_signal_handler(sig, self._on_signal, sig)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._restore()

    def _on_signal(self, sig: signal.Signals) -> None:
        self.signal_name = sig.name
        self.event.set()
        self._restore()

    def _restore(self) -> None:
        if self._loop is None:
            return
        for sig in self.SIGNALS:
            self._loop.remove_signal_handler(sig)
        self._loop = None

    @property
    def is_set(self) -> bool:
        return self.event.is_set()

    async def race(self, awaitable: Awaitable[T]) -> T:
        if self.event.is_set():
            raise Interrupted(self.signal_name)
        work = asyncio.ensure_future(awaitable)
        stopped = asyncio.ensure_future(self.event.wait())
        try:
            await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            work.cancel()
            raise
        finally:
            stopped.cancel()
        if work.done():
            return work.result()
        work.cancel()
        try:
            await work
        except (asyncio.CancelledError, Exception):
            # The work was abandoned on purpose; its outcome does not matter now.
            pass
        raise Interrupted(self.signal_name)
